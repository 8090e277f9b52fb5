package balancer

import "testing"

func TestExplanationLogAttrs(t *testing.T) {
	tests := []struct {
		name string
		e    Explanation
		want int
	}{
		{"no pin", Explanation{Policy: "llmlb", Candidates: 3, CandidateSet: "no-wait"}, 7},
		{"with a pin", Explanation{Policy: "llmlb", PinKind: "session", PinReplica: "a", PinDecision: "used"}, 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := len(tc.e.LogAttrs()); got != tc.want {
				t.Fatalf("%d attrs, want %d", got, tc.want)
			}
		})
	}
}

// TestSelectDoesNotAllocateBeyondTheReservation guards the steady state of
// BenchmarkSelectRelease: one allocation (the Reservation) per Select.
func TestSelectDoesNotAllocateBeyondTheReservation(t *testing.T) {
	b := newFleet(t, 8, nil)
	p := &Profile{SessionKey: "s", PrefixKey: "p", PromptTokens: 2000}
	res, _ := b.Select(p, t0)
	b.Release(res, OutcomeOK, t0)
	allocs := testing.AllocsPerRun(100, func() {
		res, err := b.Select(p, t0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release(res, OutcomeOK, t0)
	})
	if allocs > 1 {
		t.Fatalf("%.1f allocations per Select+Release, want 1", allocs)
	}
}
