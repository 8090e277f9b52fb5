package engine

import (
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// agenticHour drives one engine through an hour of agentic-like load in
// virtual time: sessions closed-loop (next turn after the previous answer
// and a short think time), each on one of a few projects' shared 4K-token
// system prompts, contexts growing from ~8K to ~30K tokens over 10 turns,
// 100-400 output tokens. It returns the engine and the virtual time.
func agenticHour(tb testing.TB, p Profile, sessions int, virtual time.Duration) *Engine {
	r := rand.New(rand.NewPCG(1, 2))
	e := New(p)
	type session struct {
		keys   []uint64
		tokens int
		turn   int
		next   time.Duration // next arrival; -1 while in flight
		id     uint64
	}
	var nextKey uint64 = 1 << 32
	fresh := func(s *session) {
		project := uint64(r.IntN(4))
		s.keys = s.keys[:0]
		for i := range 256 { // 4K-token shared system prompt
			s.keys = append(s.keys, project<<20|uint64(i))
		}
		s.tokens = 256*tokenize.BlockSize + 3000 + r.IntN(2000)
		for len(s.keys) < s.tokens/tokenize.BlockSize {
			nextKey++
			s.keys = append(s.keys, nextKey)
		}
		s.turn = 0
	}
	ss := make([]session, sessions)
	for i := range ss {
		fresh(&ss[i])
		ss[i].next = time.Duration(r.IntN(5000)) * time.Millisecond
	}
	byID := make(map[uint64]int, sessions)
	var id uint64
	emit := func(ev Event) {
		if ev.Kind != Finished {
			return
		}
		i := byID[ev.ID]
		delete(byID, ev.ID)
		s := &ss[i]
		s.next = ev.At.Sub(t0) + time.Duration(500+r.IntN(2500))*time.Millisecond
		s.turn++
		if s.turn == 10 || s.tokens > 30_000 {
			fresh(s)
			return
		}
		// The answer and the next tool result / user message join the context.
		s.tokens += ev.OutputTokens + 1000 + r.IntN(2000)
		for len(s.keys) < s.tokens/tokenize.BlockSize {
			nextKey++
			s.keys = append(s.keys, nextKey)
		}
	}
	for {
		// Earliest of: an engine event, a session's next turn.
		at, ok := e.NextEvent()
		next := -1
		for i := range ss {
			if ss[i].next >= 0 && (next < 0 || ss[i].next < ss[next].next) {
				next = i
			}
		}
		if next >= 0 && (!ok || !t0.Add(ss[next].next).After(at)) {
			now := t0.Add(ss[next].next)
			if ss[next].next > virtual {
				break
			}
			e.Advance(now, emit)
			s := &ss[next]
			id++
			byID[id] = next
			s.next = -1
			req := Request{ID: id, Prompt: tokenize.FromBlockKeys(s.tokens, s.keys), MaxTokens: 100 + r.IntN(300)}
			if err := e.Add(req, now); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		if !ok || at.Sub(t0) > virtual {
			break
		}
		e.Advance(at, emit)
	}
	e.Advance(t0.Add(virtual), emit)
	return e
}

// cpuTime is the process's user+system CPU time: on a shared, loaded
// machine it measures the work better than the wall clock.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEngineAgenticHour is one busy engine through a virtual hour of
// agentic load; sim-s/s is simulated seconds per wall second, sim-s/cpu-s
// the same per CPU second (GC included).
func BenchmarkEngineAgenticHour(b *testing.B) {
	for _, bc := range []struct {
		name     string
		profile  string
		sessions int
	}{
		{"3090/16sessions", DefaultProfile, 16},
		{"3090/48sessions-overloaded", DefaultProfile, 48},
		{"h100/48sessions", "h100", 48},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p, _ := Lookup(bc.profile)
			const virtual = time.Hour
			var e *Engine
			cpu0 := cpuTime()
			for b.Loop() {
				e = agenticHour(b, p, bc.sessions, virtual)
			}
			cpu := (cpuTime() - cpu0).Seconds() / float64(b.N)
			st := e.Stats()
			perOp := b.Elapsed().Seconds() / float64(b.N)
			b.ReportMetric(virtual.Seconds()/perOp, "sim-s/s")
			b.ReportMetric(virtual.Seconds()/cpu, "sim-s/cpu-s")
			b.ReportMetric(float64(e.steps), "steps/op")
			b.ReportMetric(float64(e.plans), "plans/op")
			b.ReportMetric(float64(st.Finished), "requests/op")
			b.ReportMetric(float64(st.PrefixHitTokens)/float64(max(st.PrefixQueryTokens, 1)), "hit-rate")
			b.ReportMetric(float64(st.Preemptions), "preemptions/op")
			// The cost driver: per-request work is O(prompt blocks).
			b.ReportMetric(cpu*1e9/float64(st.PrefixQueryTokens/tokenize.BlockSize), "cpu-ns/prompt-block")
		})
	}
}

// BenchmarkEngineDecodeStep is the per-step cost without fast-forwarding:
// 32 running decodes, Advance called at every step boundary (as a driver
// that polls each step would); ns/op is per simulated step.
func BenchmarkEngineDecodeStep(b *testing.B) {
	p, _ := Lookup(DefaultProfile)
	var e *Engine
	var id uint64
	refill := func() {
		e = New(p)
		for i := range 32 {
			id++
			_ = e.Add(Request{ID: id, Prompt: prompt(uint64(i), 4000), MaxTokens: 4000}, t0)
		}
	}
	refill()
	emit := func(Event) {}
	for b.Loop() {
		pl := &e.plan
		if !pl.active {
			refill()
			continue
		}
		e.Advance(pl.start.Add(pl.offset(pl.applied+1)), emit)
	}
}

// TestAgenticHourSanity keeps the benchmark's workload honest: the engine is
// busy (tens of running requests) and serves mostly from cache.
func TestAgenticHourSanity(t *testing.T) {
	if testing.Short() {
		t.Skip("long")
	}
	p, _ := Lookup(DefaultProfile)
	e := agenticHour(t, p, 16, 10*time.Minute)
	st := e.Stats()
	if st.Finished < 300 {
		t.Errorf("only %d requests in 10 virtual minutes", st.Finished)
	}
	hit := float64(st.PrefixHitTokens) / float64(st.PrefixQueryTokens)
	t.Logf("finished %d, preemptions %d, hit rate %.2f, running %d, waiting %d, KV %.2f, TTFT p50 %.2fs p99 %.2fs, steps %d plans %d",
		st.Finished, st.Preemptions, hit, st.Running, st.Waiting, st.KVCacheUsage, st.TTFT.Quantile(0.5), st.TTFT.Quantile(0.99), e.steps, e.plans)
	if hit < 0.5 {
		t.Errorf("hit rate %.2f; agentic sessions should mostly hit", hit)
	}
}
