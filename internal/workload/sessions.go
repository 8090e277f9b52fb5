package workload

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// sessionSpec describes a closed-loop workload of multi-turn sessions. Every
// range is uniform and inclusive; docs/WORKLOADS.md lists the values.
type sessionSpec struct {
	name string
	// projects > 0: that many shared system prompts, one per project, chosen
	// per session with projectWeights; 0: a distinct system prompt per session.
	projects       int
	projectWeights []float64
	system         intRange // system prompt tokens
	turns          intRange // turns per session
	burst          intRange // parallel requests per turn
	firstMsg       intRange // tokens of the first user message
	nextMsg        intRange // tokens of each later turn's new user/tool message
	suffix         intRange // own suffix of each parallel request after the first
	output         intRange // output tokens of every request
	think          durRange // from the end of a turn's last request to the next turn
	userIdle       durRange // Users mode: from a session's end to the user's next one
	// perReplicaRate is the default session arrival rate per replica of the
	// 2x3090-tp2 profile, calibrated with llmlb bench (docs/WORKLOADS.md).
	perReplicaRate float64
}

// agenticSpec: coding agents (Cursor, Kilo, Claude Code) on a handful of
// projects; each turn fires a burst of parallel requests on a growing context.
var agenticSpec = sessionSpec{
	name:           "agentic",
	projects:       5,
	projectWeights: []float64{0.35, 0.25, 0.2, 0.12, 0.08},
	system:         intRange{2000, 6000},
	turns:          intRange{8, 12},
	burst:          intRange{3, 10},
	firstMsg:       intRange{1000, 3000},
	nextMsg:        intRange{300, 1500},
	suffix:         intRange{100, 400},
	output:         intRange{64, 512},
	think:          durRange{2 * time.Second, 8 * time.Second},
	userIdle:       durRange{10 * time.Second, 120 * time.Second},
	perReplicaRate: 0.0218, // 0.087 sessions/s on 4 replicas
}

// chatSpec: long human dialogues, each with its own system prompt.
var chatSpec = sessionSpec{
	name:     "chat",
	system:   intRange{1000, 3000},
	turns:    intRange{10, 20},
	burst:    intRange{1, 1},
	firstMsg: intRange{500, 4000},
	nextMsg:  intRange{50, 600},
	output:   intRange{100, 800},
	think:    durRange{10 * time.Second, 60 * time.Second},
	userIdle: durRange{30 * time.Second, 300 * time.Second},
	// 0.22 sessions/s on 4 replicas
	perReplicaRate: 0.055,
}

// defaultRate is the session arrival rate that offers replicas
// TargetUtilisation of the load at which round-robin saturates.
func (s sessionSpec) defaultRate(replicas int) float64 {
	return s.perReplicaRate * float64(replicas)
}

// systemPrompt is one system prompt: its length, the chained hashes of the
// blocks that lie entirely inside it (block j keyed blockKey(id, j)), and
// the prefix key a client's profile carries.
type systemPrompt struct {
	tokens    int
	hashes    []uint64
	prefixKey string
}

func newSystemPrompt(id uint64, tokens int, prefixKey string) *systemPrompt {
	sp := &systemPrompt{tokens: tokens, prefixKey: prefixKey}
	sp.hashes = make([]uint64, 0, tokens/tokenize.BlockSize)
	for j := range tokens / tokenize.BlockSize {
		sp.hashes = chain(sp.hashes, blockKey(id, j))
	}
	return sp
}

// session is one running session. Its stream is the system prompt followed
// by the conversation so far; the first request of every turn sends exactly
// the stream, so turn k+1's prompt starts with all of turn k's full blocks.
type session struct {
	key       string // SessionKey and Request.Session
	user      int    // Users mode: its user; -1 for Poisson sessions
	stream    uint64 // seeds its content: the arrival index, or user<<32 | the user's session number
	rng       *rand.Rand
	sys       *systemPrompt
	contentID uint64   // names the session's own tokens
	hashes    []uint64 // chained hashes of the stream's full blocks
	streamLen int      // tokens in the stream
	lastOut   int      // output of the previous turn's first request
	turn      int
	turns     int
	open      int           // requests of the current turn not yet completed
	lastDone  time.Duration // latest completion in the current turn
}

// extend hashes the stream's new full blocks: blocks entirely inside the
// system prompt are its blocks, all later ones are keyed by the session.
// s.hashes only grows; prompts handed out hold copies.
func (s *session) extend() {
	for j := len(s.hashes); j < s.streamLen/tokenize.BlockSize; j++ {
		if j < len(s.sys.hashes) {
			s.hashes = append(s.hashes, s.sys.hashes[j])
		} else {
			s.hashes = chain(s.hashes, blockKey(s.contentID, j))
		}
	}
}

// sessionStart is a session due to begin.
type sessionStart struct {
	at     time.Duration
	user   int // -1: a Poisson arrival
	stream uint64
}

// sessionGen is a closed-loop workload: sessions arrive (Poisson at a rate,
// or a fixed population of users), and each turn after the first is
// scheduled by Complete once every request of the previous turn finished.
type sessionGen struct {
	spec    sessionSpec
	seed    int64
	salt    uint64
	horizon time.Duration
	rate    float64
	ids     *ids
	arrive  *rand.Rand // Poisson session arrivals and users' first starts
	sys     []*systemPrompt
	sysW    []float64 // cumulative project weights
	starts  startQueue
	pending queue
	active  int // sessions started and not ended
}

func newSessions(spec sessionSpec, p Params, ids *ids) (*sessionGen, error) {
	p, err := p.normalized(spec.name, true)
	if err != nil {
		return nil, err
	}
	g := &sessionGen{spec: spec, seed: p.Seed, salt: saltOf(spec.name, p.Seed), horizon: p.Duration, ids: ids}
	g.arrive = newRand(p.Seed, g.salt, 0)
	if spec.projects > 0 {
		rng := newRand(p.Seed, g.salt, 1)
		acc := 0.0
		for i := range spec.projects {
			tokens := draw(rng, spec.system)
			tenant := fmt.Sprintf("project-%d", i+1)
			key := md5Key(tenant, fmt.Sprintf("%s system prompt %d seed %d", spec.name, i+1, p.Seed))
			g.sys = append(g.sys, newSystemPrompt(contentID(g.salt, domSystem, uint64(i)), tokens, key))
			acc += spec.projectWeights[i]
			g.sysW = append(g.sysW, acc)
		}
	}
	if p.Users > 0 {
		for u := range p.Users {
			at := drawDur(g.arrive, durRange{0, spec.userIdle.Hi})
			g.schedule(sessionStart{at: at, user: u, stream: uint64(u) << 32})
		}
		return g, nil
	}
	g.rate = p.Rate
	if g.rate == 0 {
		g.rate = spec.defaultRate(p.Replicas)
	}
	g.rate *= p.speed()
	g.schedule(sessionStart{at: expGap(g.arrive, g.rate), user: -1, stream: 0})
	return g, nil
}

// schedule queues a session start unless it falls past the horizon.
func (g *sessionGen) schedule(st sessionStart) {
	if st.at < g.horizon {
		heap.Push(&g.starts, st)
	}
}

// startQueue orders session starts by time, then user, then stream, so the
// order never depends on the heap's history.
type startQueue []sessionStart

func (q startQueue) Len() int { return len(q) }
func (q startQueue) Less(i, j int) bool {
	a, b := q[i], q[j]
	if a.at != b.at {
		return a.at < b.at
	}
	if a.user != b.user {
		return a.user < b.user
	}
	return a.stream < b.stream
}
func (q startQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *startQueue) Push(x any)   { *q = append(*q, x.(sessionStart)) }
func (q *startQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// Peek implements Workload.
func (g *sessionGen) Peek() (time.Duration, bool) {
	for len(g.starts) > 0 {
		top := g.pending.top()
		if top != nil && top.At < g.starts[0].at {
			break
		}
		st := heap.Pop(&g.starts).(sessionStart)
		if st.user < 0 {
			g.schedule(sessionStart{at: st.at + expGap(g.arrive, g.rate), user: -1, stream: st.stream + 1})
		}
		g.begin(st)
	}
	if top := g.pending.top(); top != nil {
		return top.At, true
	}
	return 0, false
}

// Pop implements Workload.
func (g *sessionGen) Pop() *Request {
	if _, ok := g.Peek(); !ok {
		return nil
	}
	return g.pending.pop()
}

// Complete implements Workload: once the last request of a turn completes,
// the session's next turn is due after a think time.
func (g *sessionGen) Complete(r *Request, at time.Duration) {
	if r == nil || r.owner != completer(g) {
		return
	}
	g.complete(r, at)
}

func (g *sessionGen) complete(r *Request, at time.Duration) {
	if r.done || r.sess == nil {
		return
	}
	r.done = true
	s := r.sess
	s.open--
	s.lastDone = max(s.lastDone, at)
	if s.open > 0 {
		return
	}
	if s.turn >= s.turns {
		g.end(s, s.lastDone)
		return
	}
	next := s.lastDone + drawDur(s.rng, g.spec.think)
	if next >= g.horizon {
		g.end(s, next)
		return
	}
	g.turn(s, next)
}

// Done implements Workload.
func (g *sessionGen) Done() bool {
	return len(g.pending) == 0 && g.active == 0 && len(g.starts) == 0
}

// begin starts a session: its content comes from its own random stream, so
// the same session says the same things whatever the routing did to timing.
func (g *sessionGen) begin(st sessionStart) {
	s := &session{user: st.user, stream: st.stream, rng: newRand(g.seed, g.salt, 2+st.stream)}
	if st.user < 0 {
		s.key = fmt.Sprintf("%s-%06d", g.spec.name, st.stream+1)
	} else {
		s.key = fmt.Sprintf("%s-u%d-%d", g.spec.name, st.user+1, st.stream&0xffffffff+1)
	}
	s.contentID = contentID(g.salt, domSession, st.stream)
	if len(g.sys) > 0 {
		x := s.rng.Float64()
		i := 0
		for i < len(g.sysW)-1 && x >= g.sysW[i] {
			i++
		}
		s.sys = g.sys[i]
	} else {
		tokens := draw(s.rng, g.spec.system)
		key := md5Key("", fmt.Sprintf("%s system prompt of %s seed %d", g.spec.name, s.key, g.seed))
		s.sys = newSystemPrompt(contentID(g.salt, domSystem, 1<<63|st.stream), tokens, key)
	}
	s.turns = draw(s.rng, g.spec.turns)
	g.active++
	g.turn(s, st.at)
}

// end closes a session; in Users mode its user starts another after a pause.
func (g *sessionGen) end(s *session, at time.Duration) {
	g.active--
	s.hashes = nil
	if s.user >= 0 {
		next := at + drawDur(s.rng, g.spec.userIdle)
		g.schedule(sessionStart{at: next, user: s.user, stream: s.stream + 1})
	}
}

// turn queues the next turn's burst at at. The stream grows by the previous
// turn's answer and a new message; the first request sends the stream, the
// others the stream plus a short suffix of their own (parallel tool calls).
func (g *sessionGen) turn(s *session, at time.Duration) {
	s.turn++
	if s.turn == 1 {
		s.streamLen = s.sys.tokens + draw(s.rng, g.spec.firstMsg)
	} else {
		s.streamLen += s.lastOut + draw(s.rng, g.spec.nextMsg)
	}
	s.extend()
	n := draw(s.rng, g.spec.burst)
	s.open, s.lastDone = n, 0
	for i := range n {
		r := &Request{ID: g.ids.take(), At: at, Session: s.key, Turn: s.turn, owner: g, sess: s}
		r.Output = draw(s.rng, g.spec.output)
		if i == 0 {
			r.Prompt = extendPrompt(s.streamLen, s.hashes, 0)
			s.lastOut = r.Output
		} else {
			tokens := s.streamLen + draw(s.rng, g.spec.suffix)
			r.Prompt = extendPrompt(tokens, s.hashes, contentID(g.salt, domRequest, r.ID))
		}
		r.Profile = request.Profile{
			SessionKey:   s.key,
			PrefixKey:    s.sys.prefixKey,
			PromptTokens: r.Prompt.Tokens,
			OutputTokens: DeclaredOutput,
			PromptBlocks: r.Prompt.Blocks,
		}
		g.pending.push(r)
	}
}
