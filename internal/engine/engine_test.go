package engine

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/llmlb/llmlb/internal/tokenize"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testProfile is a small, fast deployment for unit tests: step times are
// round numbers so expected times can be computed by hand.
func testProfile() Profile {
	return Profile{
		Name:                "test",
		MaxNumSeqs:          8,
		MaxNumBatchedTokens: 1024,
		KVCacheTokens:       512 * tokenize.BlockSize,
		MaxModelLen:         4096,
		StepBase:            10 * time.Millisecond,
		StepPerSeq:          time.Millisecond,
		StepPerToken:        10 * time.Microsecond,
	}
}

// prompt builds a prompt of n tokens whose block keys are key*1000+i, so
// prompts with the same key share their prefix.
func prompt(key uint64, n int) tokenize.Prompt {
	keys := make([]uint64, n/tokenize.BlockSize)
	for i := range keys {
		keys[i] = key*1_000_000 + uint64(i)
	}
	return tokenize.FromBlockKeys(n, keys)
}

// sharedPrompt is prefix tokens of key a followed by tokens of key b.
func sharedPrompt(a uint64, prefix int, b uint64, n int) tokenize.Prompt {
	keys := make([]uint64, n/tokenize.BlockSize)
	for i := range keys {
		if i < prefix/tokenize.BlockSize {
			keys[i] = a*1_000_000 + uint64(i)
		} else {
			keys[i] = b*1_000_000 + uint64(i)
		}
	}
	return tokenize.FromBlockKeys(n, keys)
}

// op is an action of a scripted run.
type op struct {
	at    time.Duration
	add   *Request
	abort uint64
}

// drive runs the script on e until the engine is idle, advancing through
// NextEvent like the benchmark driver, and returns every event.
func drive(t testing.TB, e *Engine, ops []op) []Event {
	t.Helper()
	var evs []Event
	emit := func(ev Event) { evs = append(evs, ev) }
	i := 0
	for steps := 0; ; steps++ {
		if steps > 10_000_000 {
			t.Fatal("engine does not converge")
		}
		next, ok := e.NextEvent()
		if i < len(ops) && (!ok || !t0.Add(ops[i].at).After(next)) {
			now := t0.Add(ops[i].at)
			e.Advance(now, emit)
			if ops[i].add != nil {
				if err := e.Add(*ops[i].add, now); err != nil {
					t.Fatalf("Add(%d): %v", ops[i].add.ID, err)
				}
			} else {
				e.Abort(ops[i].abort, now)
			}
			i++
			continue
		}
		if !ok {
			return evs
		}
		e.Advance(next, emit)
	}
}

// byID returns the first event of kind k for request id.
func byID(evs []Event, id uint64, k EventKind) (Event, bool) {
	for _, ev := range evs {
		if ev.ID == id && ev.Kind == k {
			return ev, true
		}
	}
	return Event{}, false
}

func mustLookup(t *testing.T, name string) Profile {
	t.Helper()
	p, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestProfileCalibration checks docs/SIMULATOR.md's figures for the default profile
// within 10%.
func TestProfileCalibration(t *testing.T) {
	tests := []struct {
		name    string
		profile string
		prompt  int
		output  int
		want    time.Duration
	}{
		{"100K prompt, 128 out", DefaultProfile, 100_000, 128, 8 * time.Second},
		{"2K prompt, 64 out", DefaultProfile, 2_000, 64, 1500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(mustLookup(t, tt.profile))
			evs := drive(t, e, []op{{at: 0, add: &Request{ID: 1, Prompt: prompt(1, tt.prompt), MaxTokens: tt.output}}})
			fin, ok := byID(evs, 1, Finished)
			if !ok {
				t.Fatal("no Finished event")
			}
			got := fin.At.Sub(t0)
			first, _ := byID(evs, 1, FirstToken)
			t.Logf("TTFT %v, e2e %v", first.At.Sub(t0), got)
			if dev := math.Abs(float64(got-tt.want)) / float64(tt.want); dev > 0.10 {
				t.Errorf("e2e = %v, want %v within 10%% (off by %.0f%%)", got, tt.want, 100*dev)
			}
		})
	}
	p := mustLookup(t, DefaultProfile)
	if p.MaxNumSeqs != 64 || p.KVCacheTokens < 270_000 || p.KVCacheTokens > 330_000 {
		t.Errorf("default profile: %d slots, %d KV tokens; want 64 and ~300K", p.MaxNumSeqs, p.KVCacheTokens)
	}
}

func TestProfiles(t *testing.T) {
	names := ProfileNames()
	if len(names) < 2 || names[0] != DefaultProfile {
		t.Fatalf("ProfileNames() = %v, want the default first and at least one more", names)
	}
	for _, n := range names {
		p := mustLookup(t, n)
		if err := p.Validate(); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	h := mustLookup(t, "h100")
	if h.MaxNumBatchedTokens != 8192 || h.KVCacheTokens <= 2*mustLookup(t, DefaultProfile).KVCacheTokens {
		t.Errorf("h100: budget %d, KV %d", h.MaxNumBatchedTokens, h.KVCacheTokens)
	}
	if _, err := Lookup("nope"); !errors.Is(err, ErrUnknownProfile) {
		t.Errorf("Lookup(nope) = %v, want ErrUnknownProfile", err)
	}
}

func TestAddRejects(t *testing.T) {
	bad := testProfile()
	bad.MaxNumSeqs = 0
	tests := []struct {
		name    string
		profile Profile
		req     Request
		want    error // nil: accepted
	}{
		{"ok", testProfile(), Request{ID: 2, Prompt: prompt(1, 100), MaxTokens: 10}, nil},
		{"max tokens 0 means 1", testProfile(), Request{ID: 2, Prompt: prompt(1, 100)}, nil},
		{"empty prompt", testProfile(), Request{ID: 2, MaxTokens: 1}, ErrBadRequest},
		{"duplicate id", testProfile(), Request{ID: 1, Prompt: prompt(1, 100), MaxTokens: 1}, ErrBadRequest},
		{"longer than max model len", testProfile(), Request{ID: 2, Prompt: prompt(1, 4000), MaxTokens: 100}, ErrPromptTooLong},
		{"overflowing sizes", testProfile(), Request{ID: 2, Prompt: tokenize.Prompt{Tokens: math.MaxInt}, MaxTokens: math.MaxInt}, ErrPromptTooLong},
		{"larger than the KV cache", func() Profile { p := testProfile(); p.MaxModelLen = 1 << 20; return p }(),
			Request{ID: 2, Prompt: prompt(1, 9000), MaxTokens: 1}, ErrPromptTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(tt.profile)
			if err := e.Add(Request{ID: 1, Prompt: prompt(9, 32), MaxTokens: 1000}, t0); err != nil {
				t.Fatal(err)
			}
			err := e.Add(tt.req, t0)
			if !errors.Is(err, tt.want) {
				t.Errorf("Add = %v, want %v", err, tt.want)
			}
		})
	}
	if err := New(bad).Add(Request{ID: 1, Prompt: prompt(1, 10)}, t0); err == nil {
		t.Error("an invalid profile accepted a request")
	}
}

func TestEventsPerToken(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
		max    int
		want   []EventKind
	}{
		{"non-streaming", false, 4, []EventKind{FirstToken, Finished}},
		{"streaming", true, 4, []EventKind{FirstToken, Token, Token, Token, Finished}},
		{"one token", true, 1, []EventKind{FirstToken, Finished}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(testProfile())
			evs := drive(t, e, []op{{add: &Request{ID: 7, Prompt: prompt(1, 100), MaxTokens: tt.max, StreamTokens: tt.stream}}})
			var kinds []EventKind
			for i, ev := range evs {
				kinds = append(kinds, ev.Kind)
				if i > 0 && ev.At.Before(evs[i-1].At) {
					t.Errorf("event %d goes back in time", i)
				}
			}
			if d := cmp.Diff(tt.want, kinds); d != "" {
				t.Errorf("events (-want +got):\n%s", d)
			}
			if last := evs[len(evs)-1]; last.OutputTokens != tt.max {
				t.Errorf("Finished.OutputTokens = %d, want %d", last.OutputTokens, tt.max)
			}
		})
	}
}

// TestStepTiming walks one request through hand-computed step boundaries.
func TestStepTiming(t *testing.T) {
	p := testProfile()
	e := New(p)
	if err := e.Add(Request{ID: 1, Prompt: prompt(1, 1500), MaxTokens: 3}, t0); err != nil {
		t.Fatal(err)
	}
	// Chunked prefill: 1024 tokens, then 476 (+ first token), then 2 decodes.
	s1 := p.StepBase + p.StepPerSeq + 1024*p.StepPerToken
	s2 := p.StepBase + p.StepPerSeq + 476*p.StepPerToken
	d := p.StepBase + p.StepPerSeq + p.StepPerToken
	steps := []struct {
		at      time.Duration
		want    []EventKind
		running int
	}{
		{s1 - 1, nil, 1},
		{s1, nil, 1}, // prefill chunk: nothing to emit
		{s1 + s2, []EventKind{FirstToken}, 1},
		{s1 + s2 + 2*d - 1, nil, 1},
		{s1 + s2 + 2*d, []EventKind{Finished}, 0},
	}
	for _, st := range steps {
		var got []EventKind
		e.Advance(t0.Add(st.at), func(ev Event) {
			got = append(got, ev.Kind)
			if ev.At != t0.Add(st.at) {
				t.Errorf("event at %v, want %v", ev.At.Sub(t0), st.at)
			}
		})
		if d := cmp.Diff(st.want, got); d != "" {
			t.Errorf("at %v (-want +got):\n%s", st.at, d)
		}
		if r := e.Stats().Running; r != st.running {
			t.Errorf("at %v: running %d, want %d", st.at, r, st.running)
		}
	}
	if _, ok := e.NextEvent(); ok {
		t.Error("NextEvent ok on an idle engine")
	}
}

// TestPrefixCache covers the cache's hit rules: a repeat hits, a full-prompt
// hit still computes the last block, and TTFT follows the uncached tokens.
func TestPrefixCache(t *testing.T) {
	p := testProfile()
	p.MaxNumBatchedTokens = 4096 // one prefill step, so TTFT is exact
	tests := []struct {
		name       string
		first      tokenize.Prompt
		second     tokenize.Prompt
		wantCached int
	}{
		{"cold, unrelated prompt", prompt(1, 800), prompt(2, 800), 0},
		{"repeat, partial last block", prompt(1, 810), prompt(1, 810), 800},
		{"repeat, block-aligned: last block recomputed", prompt(1, 800), prompt(1, 800), 784},
		{"shared 512-token prefix", sharedPrompt(1, 512, 2, 800), sharedPrompt(1, 512, 3, 800), 512},
		{"longer follow-up turn", prompt(1, 400), prompt(1, 800), 400},
		{"prefix broken in block 0", sharedPrompt(2, 16, 1, 800), prompt(1, 800), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(p)
			evs := drive(t, e, []op{
				{at: 0, add: &Request{ID: 1, Prompt: tt.first, MaxTokens: 2}},
				{at: 10 * time.Second, add: &Request{ID: 2, Prompt: tt.second, MaxTokens: 2}},
			})
			ft, _ := byID(evs, 2, FirstToken)
			if ft.CachedTokens != tt.wantCached {
				t.Errorf("cached = %d, want %d", ft.CachedTokens, tt.wantCached)
			}
			ttft := ft.At.Sub(t0.Add(10 * time.Second))
			want := p.StepBase + p.StepPerSeq + time.Duration(tt.second.Tokens-tt.wantCached)*p.StepPerToken
			if ttft != want {
				t.Errorf("TTFT = %v, want %v (uncached %d tokens)", ttft, want, tt.second.Tokens-tt.wantCached)
			}
			st := e.Stats()
			if st.PrefixHitTokens != uint64(tt.wantCached) || st.PrefixQueryTokens != uint64(tt.first.Tokens+tt.second.Tokens) {
				t.Errorf("prefix stats %d/%d", st.PrefixHitTokens, st.PrefixQueryTokens)
			}
		})
	}
}

// TestTTFTPricesContext: on every built-in profile TTFT is the sum of the
// prefill chunks' step times, each chunk attending to everything computed
// or cached before it: a cached prefix saves its own tokens, linear and
// quadratic parts alike, but the uncached rest still attends to it.
func TestTTFTPricesContext(t *testing.T) {
	for _, name := range ProfileNames() {
		p := mustLookup(t, name)
		ttft := func(cached, uncached int) time.Duration {
			e := New(p)
			ops := []op{{at: time.Minute, add: &Request{ID: 2, Prompt: sharedPrompt(1, cached, 2, cached+uncached), MaxTokens: 1}}}
			if cached > 0 {
				ops = append([]op{{at: 0, add: &Request{ID: 1, Prompt: prompt(1, cached), MaxTokens: 1}}}, ops...)
			}
			evs := drive(t, e, ops)
			ft, _ := byID(evs, 2, FirstToken)
			if ft.CachedTokens != cached {
				t.Fatalf("cached %d, want %d", ft.CachedTokens, cached)
			}
			return ft.At.Sub(t0.Add(time.Minute))
		}
		// want is the model by hand: chunks of the token budget after c.
		want := func(c, u int) time.Duration {
			var d time.Duration
			for done := 0; done < u; {
				n := min(p.MaxNumBatchedTokens, u-done)
				halfPairs := int64(n) * int64(2*(c+done)+n)
				d += p.StepBase + p.StepPerSeq + time.Duration(n)*p.StepPerToken +
					time.Duration(int64(p.StepPerAttention)*halfPairs/2000)
				done += n
			}
			return d
		}
		t.Run(name, func(t *testing.T) {
			for _, u := range []int{2048, 8192, 32_768} {
				for _, c := range []int{0, 16_000, 48_000, 90_000} {
					if got, w := ttft(c, u), want(c, u); got != w {
						t.Errorf("%d cached + %d uncached: TTFT %v, want %v", c, u, got, w)
					}
				}
			}
			// A 90K-token hit saves far more than its linear share: the
			// 2K rest costs well under a fifth of the cold 92K prefill.
			hit, cold := ttft(90_000, 2048), ttft(0, 92_048)
			if hit*5 > cold {
				t.Errorf("90K cached + 2K: %v; cold 92K: %v", hit, cold)
			}
			// Attention makes prefill super-linear: per-token cost grows.
			a, b, c := ttft(0, 8192), ttft(0, 32_768), ttft(0, 65_536)
			if s1, s2 := float64(b-a)/(32_768-8192), float64(c-b)/(65_536-32_768); s2 <= s1 {
				t.Errorf("slope 8K..32K %.0f ns/token, 32K..64K %.0f: want growing", s1, s2)
			}
		})
	}
}

// TestIsolatedTTFT: Profile.IsolatedTTFT equals the engine's own TTFT for a
// lone request on an idle engine with an empty cache.
func TestIsolatedTTFT(t *testing.T) {
	for _, name := range ProfileNames() {
		p := mustLookup(t, name)
		for _, n := range []int{1, 15, 16, 2000, 2048, 2049, 8192, 30_000, 100_000} {
			e := New(p)
			evs := drive(t, e, []op{{at: 0, add: &Request{ID: 1, Prompt: prompt(1, n), MaxTokens: 2}}})
			ft, _ := byID(evs, 1, FirstToken)
			if got, want := p.IsolatedTTFT(n), ft.At.Sub(t0); got != want {
				t.Errorf("%s: IsolatedTTFT(%d) = %v, engine %v", name, n, got, want)
			}
		}
	}
	if got := testProfile().IsolatedTTFT(0); got != 0 {
		t.Errorf("IsolatedTTFT(0) = %v, want 0", got)
	}
}

// TestLRUEviction: freed blocks stay cached until space is needed; the
// least recently used ones go first, and a hit makes a block recent again.
func TestLRUEviction(t *testing.T) {
	p := testProfile()
	p.KVCacheTokens = 64 * tokenize.BlockSize
	p.MaxNumBatchedTokens = 4096
	const n = 20 * tokenize.BlockSize // 20 blocks, +1 for the output token
	tests := []struct {
		name   string
		ops    []op
		probeA int // cached tokens when A is asked again at the end
		probeB int
	}{
		{
			name: "no pressure: both stay cached",
			ops: []op{
				{at: 0, add: &Request{ID: 1, Prompt: prompt(1, n), MaxTokens: 1}},
				{at: time.Second, add: &Request{ID: 2, Prompt: prompt(2, n), MaxTokens: 1}},
			},
			probeA: n - 16, probeB: n - 16, // a full hit recomputes the last block
		},
		{
			name: "pressure evicts the older (A)",
			ops: []op{
				{at: 0, add: &Request{ID: 1, Prompt: prompt(1, n), MaxTokens: 1}},
				{at: time.Second, add: &Request{ID: 2, Prompt: prompt(2, n), MaxTokens: 1}},
				{at: 2 * time.Second, add: &Request{ID: 3, Prompt: prompt(3, 40*16), MaxTokens: 1}},
			},
			// C takes the never-used blocks, then A's: tail first, so A's
			// first 4 blocks survive.
			probeA: 64, probeB: n - 16,
		},
		{
			name: "a hit on A makes B the least recently used",
			ops: []op{
				{at: 0, add: &Request{ID: 1, Prompt: prompt(1, n), MaxTokens: 1}},
				{at: time.Second, add: &Request{ID: 2, Prompt: prompt(2, n), MaxTokens: 1}},
				{at: 2 * time.Second, add: &Request{ID: 4, Prompt: prompt(1, n), MaxTokens: 1}},
				{at: 3 * time.Second, add: &Request{ID: 3, Prompt: prompt(3, 40*16), MaxTokens: 1}},
			},
			probeA: n - 16, probeB: 64,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, probe := range []struct {
				key  uint64
				want int
			}{{1, tt.probeA}, {2, tt.probeB}} {
				e := New(p)
				ops := append(append([]op(nil), tt.ops...), op{at: time.Minute, add: &Request{ID: 99, Prompt: prompt(probe.key, n), MaxTokens: 1}})
				evs := drive(t, e, ops)
				ft, _ := byID(evs, 99, FirstToken)
				if ft.CachedTokens != probe.want {
					t.Errorf("prompt %d: cached %d, want %d", probe.key, ft.CachedTokens, probe.want)
				}
			}
		})
	}
}

func TestSlotsFullWaitingGrows(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 2
	e := New(p)
	for i := range uint64(5) {
		if err := e.Add(Request{ID: i + 1, Prompt: prompt(i, 64), MaxTokens: 50}, t0); err != nil {
			t.Fatal(err)
		}
	}
	e.Advance(t0.Add(200*time.Millisecond), func(Event) {})
	st := e.Stats()
	if st.Running != 2 || st.Waiting != 3 {
		t.Errorf("running %d waiting %d, want 2 and 3", st.Running, st.Waiting)
	}
	evs := drive(t, e, nil)
	n := 0
	for _, ev := range evs {
		if ev.Kind == Finished {
			n++
		}
	}
	if n != 5 || e.Stats().Waiting != 0 {
		t.Errorf("finished %d of 5, waiting %d", n, e.Stats().Waiting)
	}
}

func TestPreemptionWhenKVRunsOut(t *testing.T) {
	p := testProfile()
	p.KVCacheTokens = 64 * tokenize.BlockSize
	tests := []struct {
		name    string
		reqs    int
		prompt  int
		output  int
		preempt bool
	}{
		{"fits", 3, 160, 100, false},
		{"decode outgrows the cache", 6, 160, 300, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(p)
			var ops []op
			for i := range tt.reqs {
				ops = append(ops, op{add: &Request{ID: uint64(i + 1), Prompt: prompt(uint64(i), tt.prompt), MaxTokens: tt.output}})
			}
			evs := drive(t, e, ops)
			st := e.Stats()
			if (st.Preemptions > 0) != tt.preempt {
				t.Errorf("preemptions = %d, want any: %v", st.Preemptions, tt.preempt)
			}
			if st.Finished != uint64(tt.reqs) || st.E2E.Count != uint64(tt.reqs) {
				t.Errorf("finished %d, want %d", st.Finished, tt.reqs)
			}
			for i := range tt.reqs {
				if fin, ok := byID(evs, uint64(i+1), Finished); !ok || fin.OutputTokens != tt.output {
					t.Errorf("request %d: %+v", i+1, fin)
				}
			}
			if tt.preempt && st.PrefillComputed <= uint64(tt.reqs*tt.prompt) {
				t.Errorf("prefill computed %d: preemption should recompute", st.PrefillComputed)
			}
			if st.KVCacheUsage != 0 {
				t.Errorf("KV usage %v after all finished", st.KVCacheUsage)
			}
		})
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	tests := []struct {
		name    string
		abortAt time.Duration
	}{
		{"while waiting", 0},
		{"mid prefill", 15 * time.Millisecond},
		{"mid decode run", 500 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := testProfile()
			p.MaxNumSeqs = 1
			e := New(p)
			var evs []Event
			emit := func(ev Event) { evs = append(evs, ev) }
			_ = e.Add(Request{ID: 1, Prompt: prompt(1, 2000), MaxTokens: 1000}, t0)
			_ = e.Add(Request{ID: 2, Prompt: prompt(2, 200), MaxTokens: 1000}, t0)
			now := t0.Add(tt.abortAt)
			e.Advance(now, emit)
			if !e.Abort(2, now) || !e.Abort(1, now) {
				t.Fatal("Abort = false for a request in the engine")
			}
			if e.Abort(1, now) {
				t.Error("second Abort = true")
			}
			e.Advance(now.Add(time.Hour), emit)
			for _, ev := range evs {
				if ev.Kind == Finished {
					t.Errorf("aborted request finished: %+v", ev)
				}
			}
			st := e.Stats()
			if st.Running != 0 || st.Waiting != 0 || st.KVCacheUsage != 0 {
				t.Errorf("after abort: %+v", st)
			}
			if _, ok := e.NextEvent(); ok {
				t.Error("NextEvent ok after everything was aborted")
			}
			// The engine still serves, and cached blocks of the aborted
			// request's computed prefix may be reused.
			later := drive(t, e, []op{{at: 2 * time.Hour, add: &Request{ID: 3, Prompt: prompt(3, 100), MaxTokens: 2}}})
			if _, ok := byID(later, 3, Finished); !ok {
				t.Error("engine does not serve after an abort")
			}
		})
	}
}

// randomOps is a seeded agentic-like script: sessions whose prompts grow and
// share prefixes, bursts, streaming and aborts.
func randomOps(seed uint64, n int) []op {
	r := rand.New(rand.NewPCG(seed, 7))
	var ops []op
	at := time.Duration(0)
	ctx := map[uint64]int{}
	for i := range n {
		if r.IntN(3) == 0 {
			at += time.Duration(r.IntN(3000)) * time.Millisecond
		}
		sess := uint64(r.IntN(6))
		ctx[sess] += 200 + r.IntN(800)
		id := uint64(i + 1)
		ops = append(ops, op{at: at, add: &Request{
			ID:           id,
			Prompt:       sharedPrompt(100, 256, sess, min(ctx[sess], 3000)),
			MaxTokens:    1 + r.IntN(200),
			StreamTokens: r.IntN(4) == 0,
		}})
		if r.IntN(10) == 0 {
			ops = append(ops, op{at: at + time.Duration(r.IntN(2000))*time.Millisecond, abort: id})
		}
	}
	// ops must be in time order.
	for i := 1; i < len(ops); i++ {
		for j := i; j > 0 && ops[j].at < ops[j-1].at; j-- {
			ops[j], ops[j-1] = ops[j-1], ops[j]
		}
	}
	return ops
}

// TestFastForwardIsExact: the decode-run fast path gives exactly the events
// and counters of planning every step on its own, under arrivals, aborts,
// streaming, preemption and a small cache.
//
// Odd seeds use context-dependent step times (decode runs whose steps grow
// by a constant, timed in closed form) and a slowdown; even seeds the
// constant-step model.
func TestFastForwardIsExact(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 7} {
		p := testProfile()
		p.MaxNumSeqs = 6
		p.KVCacheTokens = 600 * tokenize.BlockSize
		p.MaxNumBatchedTokens = 512
		slow := 1.0
		if seed%2 == 1 {
			p.StepPerAttention = 333 * time.Nanosecond
			p.StepPerContextToken = 41 * time.Nanosecond
			slow = 1 + float64(seed)/10
		}
		ops := randomOps(seed, 150)
		fast := New(p)
		ref := New(p)
		ref.noRuns = true
		fast.SetSlowdown(slow)
		ref.SetSlowdown(slow)
		got := drive(t, fast, ops)
		want := drive(t, ref, ops)
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("seed %d: fast-forward differs from step-by-step (-want +got):\n%s", seed, d)
		}
		if d := cmp.Diff(ref.Stats(), fast.Stats()); d != "" {
			t.Fatalf("seed %d: stats differ (-ref +fast):\n%s", seed, d)
		}
		if fast.plans >= ref.plans {
			t.Errorf("seed %d: %d plans fast, %d step by step: no decode run fast-forwarded", seed, fast.plans, ref.plans)
		}
		if fast.Stats().Preemptions == 0 && seed == 1 {
			t.Logf("seed %d: no preemption exercised", seed)
		}
	}
}

// TestAdvanceGranularity: advancing in one jump or through every event
// gives the same events.
func TestAdvanceGranularity(t *testing.T) {
	ops := randomOps(9, 60)
	var adds []op
	for _, o := range ops {
		if o.add != nil {
			adds = append(adds, o)
		}
	}
	for _, ramp := range []bool{false, true} {
		p := testProfile()
		if ramp {
			p.StepPerAttention = 333 * time.Nanosecond
			p.StepPerContextToken = 41 * time.Nanosecond
		}
		advanceByJumps(t, p, adds)
	}
}

func advanceByJumps(t *testing.T, p Profile, adds []op) {
	t.Helper()
	a := New(p)
	want := drive(t, a, adds)
	b := New(p)
	var got []Event
	for _, o := range adds {
		b.Advance(t0.Add(o.at), func(ev Event) { got = append(got, ev) })
		if err := b.Add(*o.add, t0.Add(o.at)); err != nil {
			t.Fatal(err)
		}
	}
	b.Advance(t0.Add(24*time.Hour), func(ev Event) { got = append(got, ev) })
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("(-through events +jumps):\n%s", d)
	}
}

func TestDeterminism(t *testing.T) {
	ops := randomOps(42, 200)
	p := testProfile()
	a, b := New(p), New(p)
	ea, eb := drive(t, a, ops), drive(t, b, ops)
	if d := cmp.Diff(ea, eb); d != "" {
		t.Fatalf("two runs differ:\n%s", d)
	}
	if d := cmp.Diff(a.Stats(), b.Stats()); d != "" {
		t.Fatalf("stats differ:\n%s", d)
	}
}

func TestStatsCounters(t *testing.T) {
	e := New(testProfile())
	drive(t, e, []op{
		{at: 0, add: &Request{ID: 1, Prompt: prompt(1, 300), MaxTokens: 10}},
		{at: 0, add: &Request{ID: 2, Prompt: prompt(1, 300), MaxTokens: 5}},
	})
	st := e.Stats()
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"prompt tokens", st.PromptTokens, 600},
		{"generation tokens", st.GenerationTokens, 15},
		{"finished", st.Finished, 2},
		{"ttft count", st.TTFT.Count, 2},
		{"e2e count", st.E2E.Count, 2},
		{"query tokens", st.PrefixQueryTokens, 600},
		// Request 2 arrived while request 1's step was being planned at the
		// same instant: it joins the next step and hits what 1 scheduled.
		{"hit tokens", st.PrefixHitTokens, 288},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if len(st.TTFT.Bounds) != len(TTFTBuckets) || st.TTFT.Counts[len(st.TTFT.Counts)-1] != st.TTFT.Count {
		t.Errorf("TTFT histogram not cumulative: %+v", st.TTFT)
	}
	st.TTFT.Counts[0] = 1 << 40 // a copy: must not change the engine
	if e.Stats().TTFT.Counts[0] == 1<<40 {
		t.Error("Stats shares its histogram with the engine")
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := newHist([]float64{1, 2, 4})
	for _, v := range []float64{0.5, 1.5, 1.5, 3, 100} {
		h.observe(time.Duration(v * float64(time.Second)))
	}
	s := h.snapshot()
	tests := []struct {
		q, want float64
	}{
		{0, 0}, {0.2, 1}, {0.6, 2}, {0.7, 3}, {1, 4},
	}
	for _, tt := range tests {
		if got := s.Quantile(tt.q); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("Quantile(%v) = %v, want %v", tt.q, got, tt.want)
		}
	}
	if (Histogram{}).Quantile(0.5) != 0 {
		t.Error("empty histogram quantile != 0")
	}
}

func TestSlowdown(t *testing.T) {
	tests := []struct {
		factor float64
		want   float64 // e2e ratio to factor 1
	}{
		{1, 1}, {2, 2}, {0.5, 1}, {math.NaN(), 1},
	}
	e2e := func(f float64) time.Duration {
		e := New(testProfile())
		e.SetSlowdown(f)
		evs := drive(t, e, []op{{add: &Request{ID: 1, Prompt: prompt(1, 500), MaxTokens: 50}}})
		fin, _ := byID(evs, 1, Finished)
		return fin.At.Sub(t0)
	}
	base := e2e(1)
	for _, tt := range tests {
		if got := float64(e2e(tt.factor)) / float64(base); math.Abs(got-tt.want) > 0.01 {
			t.Errorf("slowdown %v: ratio %v, want %v", tt.factor, got, tt.want)
		}
	}
}

// TestPhaseHistograms: queue, prefill and inter-token histograms follow
// vLLM's definitions on a script whose timing is known.
func TestPhaseHistograms(t *testing.T) {
	p := testProfile()
	p.MaxNumSeqs = 1 // the second request queues behind the first
	e := New(p)
	evs := drive(t, e, []op{
		{at: 0, add: &Request{ID: 1, Prompt: prompt(1, 2000), MaxTokens: 20}},
		{at: 0, add: &Request{ID: 2, Prompt: prompt(2, 100), MaxTokens: 5, StreamTokens: true}},
	})
	first1, _ := byID(evs, 1, FirstToken)
	fin1, _ := byID(evs, 1, Finished)
	first2, _ := byID(evs, 2, FirstToken)
	fin2, _ := byID(evs, 2, Finished)
	st := e.Stats()
	secs := func(d time.Duration) float64 { return d.Seconds() }
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

	// Request 2 waits for request 1's slot: it is scheduled at 1's finish.
	if st.QueueTime.Count != 2 || !near(st.QueueTime.Sum, secs(fin1.At.Sub(t0))) {
		t.Errorf("queue time: count %d sum %v, want 2 and %v", st.QueueTime.Count, st.QueueTime.Sum, secs(fin1.At.Sub(t0)))
	}
	// Prefill time: first scheduling -> first token.
	wantPrefill := secs(first1.At.Sub(t0)) + secs(first2.At.Sub(fin1.At))
	if st.PrefillTime.Count != 2 || !near(st.PrefillTime.Sum, wantPrefill) {
		t.Errorf("prefill time: count %d sum %v, want 2 and %v", st.PrefillTime.Count, st.PrefillTime.Sum, wantPrefill)
	}
	// One gap per token after the first; the gaps add up to first -> last token.
	wantITL := secs(fin1.At.Sub(first1.At)) + secs(fin2.At.Sub(first2.At))
	if st.InterTokenLatency.Count != 19+4 || !near(st.InterTokenLatency.Sum, wantITL) {
		t.Errorf("inter-token: count %d sum %v, want 23 and %v", st.InterTokenLatency.Count, st.InterTokenLatency.Sum, wantITL)
	}
	for _, h := range []Histogram{st.QueueTime, st.PrefillTime} {
		if len(h.Bounds) != len(RequestLatencyBuckets) {
			t.Errorf("bounds %v, want vLLM's request_latency_buckets", h.Bounds)
		}
	}
	if len(st.InterTokenLatency.Bounds) != len(InterTokenBuckets) {
		t.Errorf("inter-token bounds %v", st.InterTokenLatency.Bounds)
	}
}

// TestHistogramBulk: observeN and observeRamp equal as many single
// observations, bucket by bucket and in the sum.
func TestHistogramBulk(t *testing.T) {
	bounds := []float64{0.01, 0.02, 0.05}
	tests := []struct {
		name     string
		d0, step time.Duration
		k        int
		mult     uint64
	}{
		{"constant", 15 * time.Millisecond, 0, 7, 3},
		{"ramp across buckets", 9 * time.Millisecond, 3 * time.Millisecond, 20, 2},
		{"ramp onto a bound", 8 * time.Millisecond, 2 * time.Millisecond, 3, 1},
		{"beyond the last bound", 40 * time.Millisecond, 7 * time.Millisecond, 5, 4},
		{"empty", time.Millisecond, time.Millisecond, 0, 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bulk, single := newHist(bounds), newHist(bounds)
			bulk.observeRamp(tt.d0, tt.step, tt.k, tt.mult)
			for i := range tt.k {
				for range tt.mult {
					single.observe(tt.d0 + time.Duration(i)*tt.step)
				}
			}
			if d := cmp.Diff(single.snapshot(), bulk.snapshot()); d != "" {
				t.Errorf("(-single +bulk):\n%s", d)
			}
		})
	}
}

// TestRunTiming: the closed-form timing of a decode run whose steps grow by
// delta matches summing the steps one by one.
func TestRunTiming(t *testing.T) {
	for _, pl := range []plan{
		{start: t0, dur: 30 * time.Millisecond},
		{start: t0, dur: 30 * time.Millisecond, delta: 7 * time.Microsecond},
		{start: t0, dur: 3, delta: 5},
		{start: t0, dur: 22_500_000, delta: 3840},
	} {
		const limit = 5000
		var ends []time.Duration // ends[j] = end of step j
		var at time.Duration
		ends = append(ends, 0)
		for j := 0; j < limit; j++ {
			at += pl.dur + time.Duration(j)*pl.delta
			ends = append(ends, at)
		}
		for j := 0; j <= limit; j++ {
			if pl.offset(j) != ends[j] {
				t.Fatalf("%+v: offset(%d) = %v, want %v", pl, j, pl.offset(j), ends[j])
			}
		}
		probe := []time.Duration{0, 1, pl.dur - 1, pl.dur, pl.dur + 1, ends[limit], ends[limit] + 1}
		for _, j := range []int{2, 17, 100, 999, 4999} {
			probe = append(probe, ends[j]-1, ends[j], ends[j]+1)
		}
		for _, d := range probe {
			wantBy := 0 // steps ending at or before d
			for wantBy < limit && ends[wantBy+1] <= d {
				wantBy++
			}
			if got := pl.stepsBy(t0.Add(d), limit); got != wantBy {
				t.Errorf("%+v: stepsBy(%v) = %d, want %d", pl, d, got, wantBy)
			}
			if d <= 0 {
				continue
			}
			wantUntil := 1 // fewest steps ending at or after d
			for wantUntil <= limit && ends[wantUntil] < d {
				wantUntil++
			}
			if got := pl.stepsUntil(d, limit); got != wantUntil {
				t.Errorf("%+v: stepsUntil(%v) = %d, want %d", pl, d, got, wantUntil)
			}
		}
	}
}

// TestPriorityScheduling: with one slot taken, waiting requests start in
// arrival order under first come, first served, and lowest priority value
// first (then arrival) under priority scheduling; a running request is not
// stopped for them.
func TestPriorityScheduling(t *testing.T) {
	for _, tc := range []struct {
		priority bool
		want     []uint64
	}{{false, []uint64{1, 2, 3, 4}}, {true, []uint64{1, 3, 4, 2}}} {
		p := testProfile()
		p.MaxNumSeqs, p.PriorityScheduling = 1, tc.priority
		evs := drive(t, New(p), []op{
			{at: 0, add: &Request{ID: 1, Prompt: prompt(1, 64), MaxTokens: 20, Priority: 5}},
			{at: time.Millisecond, add: &Request{ID: 2, Prompt: prompt(2, 64), MaxTokens: 5}},
			{at: 2 * time.Millisecond, add: &Request{ID: 3, Prompt: prompt(3, 64), MaxTokens: 5, Priority: -1}},
			{at: 3 * time.Millisecond, add: &Request{ID: 4, Prompt: prompt(4, 64), MaxTokens: 5, Priority: -1}},
		})
		var order []uint64
		for _, ev := range evs {
			if ev.Kind == FirstToken {
				order = append(order, ev.ID)
			}
		}
		if !slices.Equal(order, tc.want) {
			t.Errorf("priority scheduling %v: first tokens in order %v, want %v", tc.priority, order, tc.want)
		}
	}
}
