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
