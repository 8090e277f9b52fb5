// Package traffic is a client-side generator of agent-like OpenAI traffic over
// HTTP: users with sessions, a few projects sharing large system prompts,
// bursts of parallel streaming requests per turn and think time between turns.
// The demo and the load generator drive llmlb with it; it records what the
// clients saw (status, replica, time to first byte, broken streams).
package traffic

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// Options shape the traffic.
type Options struct {
	BaseURL   string        // the balancer, e.g. http://127.0.0.1:8080
	Model     string        // model name sent in every request
	Users     int           // concurrent agent users (each its own session)
	Projects  int           // projects; users of one project share a system prompt
	BurstMin  int           // parallel requests per turn, at least (agents fire 3-10)
	BurstMax  int           // parallel requests per turn, at most
	Turns     int           // turns per session before the user starts a new session
	Think     time.Duration // mean think time between turns
	MaxTokens int           // max_tokens per request
	Seed      uint64        // for reproducible prompts and timing
	Client    *http.Client  // nil: a client with no overall timeout (streams are long)
	// SystemPromptChars is the length of each project's system prompt.
	SystemPromptChars int
}

func (o *Options) setDefaults() {
	if o.Users <= 0 {
		o.Users = 8
	}
	if o.Projects <= 0 {
		o.Projects = 3
	}
	if o.BurstMin <= 0 {
		o.BurstMin = 1
	}
	if o.BurstMax < o.BurstMin {
		o.BurstMax = o.BurstMin
	}
	if o.Turns <= 0 {
		o.Turns = 10
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = 64
	}
	if o.SystemPromptChars <= 0 {
		o.SystemPromptChars = 8000
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1024}}
	}
}

// Result is what one request's client saw.
type Result struct {
	Status    int           // HTTP status; 0 when the request failed before any response
	Replica   string        // X-LLMLB-Replica
	Route     string        // X-LLMLB-Route
	FirstByte time.Duration // time to the first streamed content chunk
	Err       error         // transport failure or a stream that ended without [DONE]
	Session   string
}

// Stats are the totals of a run; safe to read while it runs through Snapshot.
type Stats struct {
	mu        sync.Mutex
	requests  int
	ok        int
	failed    int
	byStatus  map[int]int
	byReplica map[string]int
	byRoute   map[string]int
	errors    map[string]int
	ttfb      []time.Duration
}

// Summary is a copy of Stats at one instant.
type Summary struct {
	Requests  int            `json:"requests"`
	OK        int            `json:"ok"`
	Failed    int            `json:"failed"`
	ByStatus  map[int]int    `json:"by_status"`
	ByReplica map[string]int `json:"by_replica"`
	ByRoute   map[string]int `json:"by_route"`
	Errors    map[string]int `json:"errors"`
	TTFBp50   time.Duration  `json:"ttfb_p50"`
	TTFBp99   time.Duration  `json:"ttfb_p99"`
}

func newStats() *Stats {
	return &Stats{byStatus: map[int]int{}, byReplica: map[string]int{}, byRoute: map[string]int{}, errors: map[string]int{}}
}

func (s *Stats) record(r Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests++
	if r.Err == nil && r.Status == http.StatusOK {
		s.ok++
		s.ttfb = append(s.ttfb, r.FirstByte)
	} else {
		s.failed++
		if r.Err != nil {
			s.errors[errorClass(r.Err)]++
		}
	}
	s.byStatus[r.Status]++
	if r.Replica != "" {
		s.byReplica[r.Replica]++
	}
	if r.Route != "" {
		s.byRoute[r.Route]++
	}
}

// errorClass keeps error counts readable: the message up to its first colon detail.
func errorClass(err error) string {
	msg := err.Error()
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return msg
}

// Snapshot copies the totals.
func (s *Stats) Snapshot() Summary {
	s.mu.Lock()
	defer s.mu.Unlock()
	sum := Summary{Requests: s.requests, OK: s.ok, Failed: s.failed,
		ByStatus: map[int]int{}, ByReplica: map[string]int{}, ByRoute: map[string]int{}, Errors: map[string]int{}}
	for k, v := range s.byStatus {
		sum.ByStatus[k] = v
	}
	for k, v := range s.byReplica {
		sum.ByReplica[k] = v
	}
	for k, v := range s.byRoute {
		sum.ByRoute[k] = v
	}
	for k, v := range s.errors {
		sum.Errors[k] = v
	}
	if n := len(s.ttfb); n > 0 {
		d := append([]time.Duration(nil), s.ttfb...)
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		sum.TTFBp50 = d[n/2]
		sum.TTFBp99 = d[min(n-1, n*99/100)]
	}
	return sum
}

// Generator runs agent users until its context ends.
type Generator struct {
	opts  Options
	stats *Stats
	// OnResult, when set before Run, sees every result (called concurrently).
	OnResult func(Result)
}

// New returns a generator; call Run to start it.
func New(opts Options) *Generator {
	opts.setDefaults()
	return &Generator{opts: opts, stats: newStats()}
}

// Stats returns the live totals.
func (g *Generator) Stats() *Stats { return g.stats }

// Run starts Users agent loops and returns when ctx is done and every
// in-flight request has ended.
func (g *Generator) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for u := range g.opts.Users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.user(ctx, u)
		}()
	}
	wg.Wait()
}

// user is one agent: sessions of Turns turns, each a burst of parallel requests.
func (g *Generator) user(ctx context.Context, u int) {
	rng := rand.New(rand.NewPCG(g.opts.Seed, uint64(u)+1))
	project := u % g.opts.Projects
	system := systemPrompt(project, g.opts.SystemPromptChars)
	for session := 0; ctx.Err() == nil; session++ {
		sessionID := fmt.Sprintf("user%d-s%d", u, session)
		history := []message{{Role: "system", Content: system}}
		for turn := 0; turn < g.opts.Turns && ctx.Err() == nil; turn++ {
			history = append(history, message{Role: "user", Content: filler(rng, 200+rng.IntN(800))})
			burst := g.opts.BurstMin + rng.IntN(g.opts.BurstMax-g.opts.BurstMin+1)
			var wg sync.WaitGroup
			for b := range burst {
				msgs := history
				if b > 0 { // parallel tool calls: same history, a distinct last message
					msgs = append(append([]message(nil), history...), message{Role: "user", Content: fmt.Sprintf("tool call %d: %s", b, filler(rng, 100))})
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := g.do(ctx, sessionID, msgs)
					if ctx.Err() != nil && r.Err != nil {
						return // stopped by the run's end, not a failure
					}
					g.stats.record(r)
					if g.OnResult != nil {
						g.OnResult(r)
					}
				}()
			}
			wg.Wait()
			history = append(history, message{Role: "assistant", Content: filler(rng, 4*g.opts.MaxTokens)})
			if g.opts.Think > 0 {
				think := time.Duration(rng.ExpFloat64() * float64(g.opts.Think))
				select {
				case <-ctx.Done():
				case <-time.After(think):
				}
			}
		}
	}
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// do sends one streaming chat completion and reads it to the end.
func (g *Generator) do(ctx context.Context, session string, msgs []message) Result {
	res := Result{Session: session}
	body, _ := json.Marshal(map[string]any{
		"model":          g.opts.Model,
		"messages":       msgs,
		"max_tokens":     g.opts.MaxTokens,
		"stream":         true,
		"stream_options": map[string]any{"include_usage": true},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(g.opts.BaseURL, "/")+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		res.Err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", session)
	start := time.Now()
	resp, err := g.opts.Client.Do(req)
	if err != nil {
		res.Err = err
		return res
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Replica = resp.Header.Get("X-LLMLB-Replica")
	res.Route = resp.Header.Get("X-LLMLB-Route")
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return res
	}
	res.FirstByte, res.Err = readStream(resp.Body, start)
	return res
}

// errNoDone: the stream ended without its final data: [DONE] line.
var errNoDone = errors.New("traffic: stream ended without [DONE]")

// readStream reads an SSE body to [DONE]; an error event or an early end is an error.
func readStream(body io.Reader, start time.Time) (time.Duration, error) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	var first time.Duration
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		if first == 0 {
			first = time.Since(start)
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			return first, nil
		}
		if bytes.HasPrefix(data, []byte(`{"error"`)) {
			return first, fmt.Errorf("traffic: stream error event: %s", data)
		}
	}
	if err := sc.Err(); err != nil {
		return first, fmt.Errorf("traffic: reading stream: %w", err)
	}
	return first, errNoDone
}

// systemPrompt is a project's fixed system prompt: equal for every user of it.
func systemPrompt(project, chars int) string {
	rng := rand.New(rand.NewPCG(uint64(project)+1000, 7))
	return fmt.Sprintf("You are the coding agent of project %d. ", project) + filler(rng, chars)
}

var words = strings.Fields("the model reads a file then calls a tool and writes the patch while tests run on every change of the repository code review agent plans steps")

// filler returns about n characters of deterministic text.
func filler(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()
}
