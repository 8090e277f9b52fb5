package workload

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/llmlb/llmlb/internal/request"
)

// openSpec describes an open-loop workload: independent requests with
// Poisson arrivals and no sessions.
type openSpec struct {
	name string
	// scenarios > 0: that many shared prefixes of prefix tokens each, one
	// chosen uniformly per request and followed by a unique suffix.
	scenarios int
	prefix    int
	suffix    intRange
	output    intRange
	// longShare of the requests are long ones (longPrompt, longOutput); the
	// rest have a unique prompt of shortPrompt tokens and shortOutput output.
	longShare   float64
	longPrompt  intRange
	longOutput  intRange
	shortPrompt intRange
	shortOutput intRange
	// perReplicaRate is the default request rate per replica of the
	// 2x3090-tp2 profile, calibrated with llmlb bench (docs/WORKLOADS.md).
	perReplicaRate float64
}

// oneshotSpec: a few product scenarios, each a 2,000-token shared prefix,
// called by independent one-shot requests (no session id) (docs/WORKLOADS.md).
var oneshotSpec = openSpec{
	name:      "oneshot",
	scenarios: 6,
	prefix:    2000,
	suffix:    intRange{100, 400},
	output:    intRange{32, 320},
	// 17.2 requests/s on 4 replicas
	perReplicaRate: 4.3,
}

// longshortSpec (docs/WORKLOADS.md): occasional 100K-token prefills amid a
// stream of short requests.
var longshortSpec = openSpec{
	name:        "longshort",
	longShare:   0.02,
	longPrompt:  intRange{90000, 110000},
	longOutput:  intRange{128, 128},
	shortPrompt: intRange{1536, 2560},
	shortOutput: intRange{64, 64},
	// 11.8 requests/s on 4 replicas
	perReplicaRate: 2.95,
}

// defaultRate is the request rate that offers replicas TargetUtilisation
// of the load at which round-robin saturates.
func (s openSpec) defaultRate(replicas int) float64 {
	return s.perReplicaRate * float64(replicas)
}

// openGen generates an open-loop workload; Complete changes nothing.
type openGen struct {
	spec    openSpec
	salt    uint64
	horizon time.Duration
	rate    float64
	ids     *ids
	rng     *rand.Rand
	sys     []*systemPrompt
	nextAt  time.Duration
	next    *Request // the materialised next arrival, nil if not yet drawn
}

func newOpen(spec openSpec, p Params, ids *ids) (*openGen, error) {
	p, err := p.normalized(spec.name, false)
	if err != nil {
		return nil, err
	}
	g := &openGen{spec: spec, salt: saltOf(spec.name, p.Seed), horizon: p.Duration, rate: p.Rate, ids: ids}
	if g.rate == 0 {
		g.rate = spec.defaultRate(p.Replicas)
	}
	g.rate *= p.speed()
	g.rng = newRand(p.Seed, g.salt, 0)
	for i := range spec.scenarios {
		key := md5Key("", fmt.Sprintf("%s scenario %d seed %d", spec.name, i+1, p.Seed))
		g.sys = append(g.sys, newSystemPrompt(contentID(g.salt, domSystem, uint64(i)), spec.prefix, key))
	}
	g.nextAt = expGap(g.rng, g.rate)
	return g, nil
}

// Peek implements Workload.
func (g *openGen) Peek() (time.Duration, bool) {
	if g.next == nil && g.nextAt < g.horizon {
		g.next = g.make(g.nextAt)
		g.nextAt += expGap(g.rng, g.rate)
	}
	if g.next == nil {
		return 0, false
	}
	return g.next.At, true
}

// Pop implements Workload.
func (g *openGen) Pop() *Request {
	g.Peek()
	r := g.next
	g.next = nil
	return r
}

// Complete implements Workload; open-loop arrivals do not depend on it.
func (g *openGen) Complete(r *Request, at time.Duration) {
	if r != nil && r.owner == completer(g) {
		g.complete(r, at)
	}
}

func (g *openGen) complete(r *Request, _ time.Duration) { r.done = true }

// Done implements Workload.
func (g *openGen) Done() bool { return g.next == nil && g.nextAt >= g.horizon }

// make draws one request arriving at at. One-shot requests carry no session
// key: a client making independent calls sends none.
func (g *openGen) make(at time.Duration) *Request {
	r := &Request{ID: g.ids.take(), At: at, Turn: 1, owner: g}
	own := contentID(g.salt, domRequest, r.ID)
	var prefixKey string
	switch {
	case g.spec.scenarios > 0:
		sp := g.sys[g.rng.IntN(len(g.sys))]
		tokens := sp.tokens + draw(g.rng, g.spec.suffix)
		r.Prompt = extendPrompt(tokens, sp.hashes, own)
		r.Output = draw(g.rng, g.spec.output)
		prefixKey = sp.prefixKey
	case g.rng.Float64() < g.spec.longShare:
		r.Prompt = extendPrompt(draw(g.rng, g.spec.longPrompt), nil, own)
		r.Output = draw(g.rng, g.spec.longOutput)
	default:
		r.Prompt = extendPrompt(draw(g.rng, g.spec.shortPrompt), nil, own)
		r.Output = draw(g.rng, g.spec.shortOutput)
	}
	r.Profile = request.Profile{
		PrefixKey:    prefixKey,
		PromptTokens: r.Prompt.Tokens,
		OutputTokens: DeclaredOutput,
		PromptBlocks: r.Prompt.Blocks,
	}
	return r
}
