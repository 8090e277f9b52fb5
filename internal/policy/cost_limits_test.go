package policy

import "testing"

// TestCostLearnedSlots: with cost.max_num_seqs at its default (0), each
// replica's batch is the limit the balancer learned (Candidate.MaxRunning),
// DefaultMaxNumSeqs while none is known; a configured value overrides.
func TestCostLearnedSlots(t *testing.T) {
	for _, tc := range []struct {
		name       string
		maxNumSeqs int     // cost.max_num_seqs
		learned    float64 // Candidate.MaxRunning
		want       float64
	}{
		{"not known", 0, 0, DefaultMaxNumSeqs},
		{"learned", 0, 4, 4},
		{"configured overrides", 16, 4, 16},
		{"configured, none learned", 16, 0, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, func(c *CostConfig) { c.MaxNumSeqs = tc.maxNumSeqs })
			c := Candidate{MaxRunning: tc.learned}
			if got := p.slots(&c); got != tc.want {
				t.Errorf("slots = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestCostPricesALearnedFullBatch: two replicas alike but for their
// learned slot limits, both running 4 of the balancer's requests: the one
// that runs only 4 at once makes a new request wait for a slot, so cost
// sends it to the other, which it could not tell apart with the default.
func TestCostPricesALearnedFullBatch(t *testing.T) {
	for _, tc := range []struct {
		name    string
		limits  [2]float64
		wantOne bool // the request goes to the second replica
	}{
		{"limits learned", [2]float64{4, 16}, true},
		{"second full", [2]float64{16, 4}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(2)
			for i := range cands {
				cands[i].MaxRunning, cands[i].InFlight, cands[i].ScrapedRunning, cands[i].MeanOutput = tc.limits[i], 4, 4, 200
			}
			c := p.Choose(costPrompt("p", 10, 0, ""), cands, t0)
			if (c.Index == 1) != tc.wantOne {
				t.Fatalf("chose %d: %+v", c.Index, c)
			}
		})
	}
}

func TestCostMaxNumSeqsValidation(t *testing.T) {
	cfg := DefaultCostConfig()
	if cfg.MaxNumSeqs != 0 || cfg.Validate() != nil {
		t.Fatalf("default max_num_seqs %d (%v), want 0 (learn) and valid", cfg.MaxNumSeqs, cfg.Validate())
	}
	cfg.MaxNumSeqs = -1
	if cfg.Validate() == nil {
		t.Fatal("max_num_seqs -1 accepted")
	}
}
