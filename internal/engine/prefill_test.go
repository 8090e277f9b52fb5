package engine

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPartialPrefills: a short prompt that arrives with a long one waits
// for the long one's whole prefill when prefill is serial, and shares the
// first step with it when prefills run in parallel, which delays the long
// one by the short one's tokens.
func TestPartialPrefills(t *testing.T) {
	long := Request{ID: 1, Prompt: prompt(1, 4000), MaxTokens: 4}
	short := Request{ID: 2, Prompt: prompt(2, 300), MaxTokens: 4}
	ops := []op{{at: 0, add: &long}, {at: 0, add: &short}}
	// testProfile: 1024 tokens a step; a step takes 10 ms + 1 ms a request
	// + 10 us a token. The long prompt's Add plans the first step alone
	// (1024 tokens: 21.24 ms); the short one joins at the second.
	const first = 21240 * time.Microsecond
	for _, tc := range []struct {
		name                string
		partial             int
		wantLong, wantShort time.Duration
	}{
		// Serial: the long prompt takes steps of 1024, 1024, 1024 and
		// 928 tokens, the last shared with the short one's first 96
		// (2 requests: 22.24 ms); the short one's last 204 tokens and
		// the long one's decode token make a fifth step (14.05 ms).
		{"serial", 1, 3*first + 22240*time.Microsecond, 3*first + 22240*time.Microsecond + 14050*time.Microsecond},
		// Parallel: the second step gives the long prompt half of the
		// 1024 tokens and the short one its 300 (20.12 ms); its first
		// token ends that step.
		{"parallel", 2, 0, first + 20120*time.Microsecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testProfile()
			p.MaxPartialPrefills = tc.partial
			evs := drive(t, New(p), ops)
			l, okL := byID(evs, 1, FirstToken)
			s, okS := byID(evs, 2, FirstToken)
			if !okL || !okS {
				t.Fatalf("first tokens missing: %v", evs)
			}
			if got := s.At.Sub(t0); got != tc.wantShort {
				t.Errorf("short prompt's TTFT %v, want %v", got, tc.wantShort)
			}
			if tc.wantLong > 0 {
				if got := l.At.Sub(t0); got != tc.wantLong {
					t.Errorf("long prompt's TTFT %v, want %v", got, tc.wantLong)
				}
			}
			if (s.At.Before(l.At)) != (tc.partial > 1) {
				t.Errorf("short first at %v, long at %v: parallel %v", s.At.Sub(t0), l.At.Sub(t0), tc.partial > 1)
			}
		})
	}
}

// TestPartialPrefillsFastForward: with parallel prefill, fast-forwarded
// decode runs still give exactly the step-by-step events.
func TestPartialPrefillsFastForward(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		p := testProfile()
		p.MaxNumSeqs = 6
		p.MaxPartialPrefills = 3
		p.MaxNumBatchedTokens = 512
		ops := randomOps(seed, 150)
		fast, ref := New(p), New(p)
		ref.noRuns = true
		got, want := drive(t, fast, ops), drive(t, ref, ops)
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("seed %d: fast-forward differs from step-by-step (-want +got):\n%s", seed, d)
		}
	}
}

func TestProfileRejectsNegativePartialPrefills(t *testing.T) {
	p := testProfile()
	p.MaxPartialPrefills = -1
	if err := p.Validate(); err == nil {
		t.Fatal("MaxPartialPrefills -1 accepted")
	}
}

// TestPrefixHitWhilePrefilling: as in vLLM v1, the blocks a prefill chunk
// fills are cached when the chunk is scheduled (KVCacheManager.allocate_slots
// caches up to the computed plus the newly scheduled tokens), and a request
// looks the cache up only when it is admitted. A request B whose prompt
// shares A's first 2048 tokens, admitted while A still prefills them, hits
// A's blocks up to the end of A's chunk of that step (scheduled before B:
// running requests go first, and the waiting queue is served in order) and
// computes the rest of the shared prefix itself; it never waits for A. With
// serial prefill A's chunks take the whole budget, so B is admitted only in
// the step that schedules A's last tokens, and hits the whole prefix.
func TestPrefixHitWhilePrefilling(t *testing.T) {
	// testProfile: 1024 tokens a step. C is a one-block request whose
	// prefill is the first step [0, 11.16 ms] and that decodes after
	// it, taking 1 token of every later step; A (3,000 tokens) arrives
	// during the first step, so its prefill starts in the second
	// [11.16 ms, 33.40 ms].
	c := Request{ID: 3, Prompt: prompt(9, 16), MaxTokens: 100}
	a := Request{ID: 1, Prompt: prompt(1, 3000), MaxTokens: 2}
	b := Request{ID: 2, Prompt: sharedPrompt(1, 2048, 2, 2400), MaxTokens: 2}
	for _, tc := range []struct {
		name       string
		partial    int
		bAt        time.Duration
		wantCached int
	}{
		// A's chunks: 1023, 1023, 954 tokens; B is admitted with the
		// last (budget 69 left) and finds all 128 shared blocks.
		{"serial, B arrives with A", 1, time.Millisecond, 2048},
		{"serial, B arrives a step later", 1, 20 * time.Millisecond, 2048},
		// A and B split the 1023 tokens C leaves: A's first chunk of
		// 511 fills 31 blocks, which B, admitted right after A, hits.
		{"parallel, B admitted in A's first step", 2, time.Millisecond, 31 * 16},
		// A's first chunk (alone: 1023 tokens) and its second (511,
		// shared with B, scheduled before B is admitted) fill 95
		// blocks.
		{"parallel, B admitted a step later", 2, 20 * time.Millisecond, 95 * 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := testProfile()
			p.MaxPartialPrefills = tc.partial
			e := New(p)
			evs := drive(t, e, []op{{at: 0, add: &c}, {at: time.Millisecond, add: &a}, {at: tc.bAt, add: &b}})
			ft, ok := byID(evs, 2, FirstToken)
			if !ok {
				t.Fatalf("B has no first token: %v", evs)
			}
			if ft.CachedTokens != tc.wantCached {
				t.Errorf("B found %d tokens cached, want %d", ft.CachedTokens, tc.wantCached)
			}
			// Every prompt token not found in the cache is computed:
			// the shared blocks B missed are computed twice.
			want := uint64(c.Prompt.Tokens + a.Prompt.Tokens + b.Prompt.Tokens - tc.wantCached)
			if got := e.Stats().PrefillComputed; got != want {
				t.Errorf("PrefillComputed %d, want %d", got, want)
			}
		})
	}
}
