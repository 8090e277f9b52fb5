package policy

import "testing"

// TestCostNamesTheRuleThatDecided: every cost choice says which rule
// decided it and against which runner-up.
func TestCostNamesTheRuleThatDecided(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T) (*Cost, []Candidate, *Request, int) // the policy, candidates, request, the runner-up's index (-1: none)
		want  string
	}{
		{"cache: the replica holding the prompt is fastest", func(t *testing.T) (*Cost, []Candidate, *Request, int) {
			p, cands := newCost(t, nil), costCands(2)
			first := p.Choose(costPrompt("sys", 100, 0, "s1"), cands, t0)
			return p, cands, costPrompt("sys", 100, 2, "s1"), 1 - first.Index
		}, RuleCache},
		{"load: less work queued ahead", func(t *testing.T) (*Cost, []Candidate, *Request, int) {
			p, cands := newCost(t, nil), costCands(2)
			cands[0].PendingPrefill, cands[0].PendingRequests = 10_000, 1
			return p, cands, costPrompt("x", 0, 4, "s"), 0
		}, RuleLoad},
		{"tie: identical idle replicas", func(t *testing.T) (*Cost, []Candidate, *Request, int) {
			p, cands := newCost(t, nil), costCands(2)
			return p, cands, costPrompt("x", 0, 4, "s"), -2 // either
		}, RuleTie},
		{"bounded load: the cached replica is over its share", func(t *testing.T) (*Cost, []Candidate, *Request, int) {
			p := newCost(t, func(c *CostConfig) { c.BoundedLoad, c.BoundedLoadSlack = 1.5, 2 })
			cands := costCands(4)
			first := p.Choose(costPrompt("shared", 50, 0, ""), cands, t0)
			for i := range cands {
				cands[i].InFlight = 2
			}
			cands[first.Index].InFlight = 20
			return p, cands, costPrompt("shared", 50, 1, ""), first.Index
		}, RuleBoundedLoad},
		{"only candidate", func(t *testing.T) (*Cost, []Candidate, *Request, int) {
			p, cands := newCost(t, nil), costCands(1)
			return p, cands, costPrompt("x", 0, 4, "s"), -1
		}, RuleOnly},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, cands, r, ru := tc.setup(t)
			c := p.Choose(r, cands, t0)
			if c.Rule != tc.want {
				t.Fatalf("rule %q, want %q (%+v)", c.Rule, tc.want, c)
			}
			switch {
			case ru == -1:
				if c.RunnerUp != "" {
					t.Fatalf("runner-up %q with one candidate", c.RunnerUp)
				}
			case ru >= 0 && c.RunnerUp != cands[ru].Name:
				t.Fatalf("runner-up %q, want %q", c.RunnerUp, cands[ru].Name)
			case ru == -2 && (c.RunnerUp == "" || c.RunnerUp == cands[c.Index].Name):
				t.Fatalf("runner-up %q for chosen %q", c.RunnerUp, cands[c.Index].Name)
			}
			if c.PendingPrefill != cands[c.Index].PendingPrefill {
				t.Fatalf("pending prefill %v, want the chosen's %v", c.PendingPrefill, cands[c.Index].PendingPrefill)
			}
			if tc.want == RuleCache || tc.want == RuleLoad {
				if !(c.RunnerUpEstimate > c.Estimate) {
					t.Fatalf("%s won with TTFT %.3fs against the runner-up's %.3fs", tc.want, c.Estimate, c.RunnerUpEstimate)
				}
			}
		})
	}
}

// TestEveryPolicyNamesItsRule: each registered policy says, in Rule or in
// its pin decision, why it chose.
func TestEveryPolicyNamesItsRule(t *testing.T) {
	want := map[string]string{
		NameRR:           "rotation",
		NameLeastRequest: "fewest in flight",
		NameSticky:       "session hash",
		NamePrefixTree:   "match below threshold: smallest tree",
		NameLLMD:         "highest weighted score",
		NameCost:         RuleTie,
	}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			f, _ := Lookup(name)
			p, err := f.New(DefaultSettings())
			if err != nil {
				t.Fatal(err)
			}
			c := p.Choose(costPrompt("x", 0, 4, "s1"), costCands(3), t0)
			if name == NameLLMLB || name == NameLLMLBWarm {
				// The pin policies explain by their pin: a new session pin here.
				if c.PinKind != "session" || c.PinDecision != "new" {
					t.Fatalf("pin %q %q, want a new session pin", c.PinKind, c.PinDecision)
				}
				return
			}
			w, ok := want[name]
			if !ok {
				t.Fatalf("policy %s has no expected rule in this test", name)
			}
			if c.Rule != w {
				t.Fatalf("rule %q, want %q", c.Rule, w)
			}
		})
	}
}
