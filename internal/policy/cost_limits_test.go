package policy

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"
)

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

// prefillEngine is the time to first token of a replica whose true
// prefill throughput is rate tokens per second and which runs a step of
// step seconds per batch_tokens chunk: serial computes all the work ahead
// first; parallel computes each of the requests ahead only up to the new
// prompt's length before it is done.
func prefillEngine(parallel bool, rate, step, batch float64, ahead []float64, prefill float64) float64 {
	work := prefill
	for _, w := range ahead {
		if parallel {
			w = min(w, prefill)
		}
		work += w
	}
	return step*(1+math.Floor(work/batch)) + work/rate
}

// TestCostLearnsPrefillConcurrency: a replica whose first tokens come as a
// serial engine's stays serial; one whose come as a parallel engine's is
// learned as such, and its estimates then follow it; one slower than its
// learned rate says is learned slower.
func TestCostLearnsPrefillConcurrency(t *testing.T) {
	for _, tc := range []struct {
		name       string
		parallel   bool
		slowdown   float64 // true time over what the learned rate says
		wantShared [2]float64
	}{
		{"serial", false, 1, [2]float64{0, 0.05}},
		{"parallel", true, 1, [2]float64{0.95, 1}},
		{"serial, slower than its rate", false, 2, [2]float64{0, 0.05}},
		{"parallel, slower than its rate", true, 2, [2]float64{0.95, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(1)
			c := &cands[0]
			rate, batch := c.PrefillRate/tc.slowdown, float64(p.cfg.BatchTokens)
			step := c.DecodeStep * tc.slowdown
			engine := func(k int, prompt int) ([]float64, float64) {
				// k requests ahead of one length (the balancer knows only
				// their sum and count), and this prompt.
				ahead := make([]float64, k)
				for j := range ahead {
					ahead[j] = float64(256 * (1 + (k+prompt)%7))
				}
				return ahead, float64(prompt * 16)
			}
			var errs []float64 // relative errors of the estimates, once learned
			for i := range 3000 {
				ahead, prefill := engine(i%5, 4+i%60)
				c.PendingRequests, c.PendingPrefill = len(ahead), 0
				for _, w := range ahead {
					c.PendingPrefill += w
				}
				// A prompt of fresh blocks: nothing cached, all computed.
				r := costPrompt(fmt.Sprintf("q%d", i), 0, int(prefill/16), "")
				ch := p.Choose(r, cands, t0.Add(time.Duration(i)*time.Second))
				truth := prefillEngine(tc.parallel, rate, step, batch, ahead, float64(ch.PrefillTokens))
				if i >= 2000 {
					errs = append(errs, math.Abs(ch.Estimate/truth-1))
				}
				p.ObserveFirstToken(c.Name, ch.Shape, truth)
			}
			scale, shared := p.prefill.model(p.ids[c.Name])
			if shared < tc.wantShared[0] || shared > tc.wantShared[1] {
				t.Errorf("shared = %.3f (scale %.3f), want within %v", shared, scale, tc.wantShared)
			}
			// A restart forgets the replica's share.
			p.ForgetCache(c.Name)
			if _, a := p.prefill.model(p.ids[c.Name]); a != 0 {
				t.Errorf("shared %.3f after a restart, want 0", a)
			}
			slices.Sort(errs)
			if e := errs[len(errs)/2]; e > 0.1 {
				t.Errorf("median estimate error %.3f (scale %.3f, shared %.3f), want at most 0.1", e, scale, shared)
			}
		})
	}
}

// TestCostPrefillPrior: until a replica has a first token it is priced as
// a serial engine at its learned rate, and first tokens that say nothing
// (no time, waits longer than the time, bad numbers, a replica never
// chosen) leave it so.
func TestCostPrefillPrior(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(1)
	cands[0].PendingPrefill, cands[0].PendingRequests = 4096, 2
	ch := p.Choose(costPrompt("p", 0, 8, ""), cands, t0)
	if ch.Shape.Serial <= ch.Shape.Shared || math.Abs(ch.Estimate-(ch.Shape.Waits+ch.Shape.Serial)) > 1e-12 {
		t.Fatalf("prior estimate %v, shape %+v: want the serial time", ch.Estimate, ch.Shape)
	}
	nan, inf := math.NaN(), math.Inf(1)
	for _, s := range []struct {
		shape    PrefillShape
		measured float64
	}{
		{ch.Shape, 0}, {ch.Shape, -1}, {ch.Shape, nan}, {ch.Shape, inf},
		{PrefillShape{Waits: 2, Serial: 1, Shared: 1}, 1},
		{PrefillShape{Serial: nan, Shared: 1}, 1}, {PrefillShape{Serial: 1, Shared: inf}, 1},
		{PrefillShape{Serial: 0, Shared: 0}, 1}, {PrefillShape{Waits: nan, Serial: 1, Shared: 1}, 1},
	} {
		p.ObserveFirstToken(cands[0].Name, s.shape, s.measured)
	}
	p.ObserveFirstToken("never-chosen", ch.Shape, 1)
	if scale, shared := p.prefill.model(p.ids[cands[0].Name]); scale != 1 || shared != 0 {
		t.Errorf("after samples that say nothing: scale %v, shared %v, want 1, 0", scale, shared)
	}
	// Wildly off first tokens move the model only within its bounds.
	for range 10_000 {
		p.ObserveFirstToken(cands[0].Name, ch.Shape, 1e6)
	}
	if scale, _ := p.prefill.model(p.ids[cands[0].Name]); scale != maxPrefillScale {
		t.Errorf("scale %v after far slower first tokens, want the bound %v", scale, maxPrefillScale)
	}
	for range 10_000 {
		p.ObserveFirstToken(cands[0].Name, ch.Shape, 1e-9)
	}
	if scale, _ := p.prefill.model(p.ids[cands[0].Name]); scale != minPrefillScale {
		t.Errorf("scale %v after far faster first tokens, want the bound %v", scale, minPrefillScale)
	}
}

// TestCostLearnsPrefillSize: a replica whose long prompts take longer per
// token than its short ones (an engine sharing its steps among prefills)
// or shorter is learned to (its size exponent nears the engine's), and its
// estimates then follow it; one whose time grows with the prompt as its
// rate says keeps the exponent near 0; a restart forgets it.
func TestCostLearnsPrefillSize(t *testing.T) {
	for _, tc := range []struct {
		name     string
		exponent float64 // the engine's prefill time is the serial one x (tokens / sizeRef)^exponent
		wantSize [2]float64
	}{
		{"linear", 0, [2]float64{-0.05, 0.05}},
		{"long prompts slower", 0.3, [2]float64{0.2, 0.4}},
		{"long prompts faster", -0.3, [2]float64{-0.4, -0.2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(1)
			c := &cands[0]
			var errs []float64 // relative errors of the estimates, once learned
			for i := range 4000 {
				blocks := 4 << (i % 6)                                 // 64 to 2,048 tokens
				r := costPrompt(fmt.Sprintf("q%d/", i), blocks, 0, "") // fresh blocks
				ch := p.Choose(r, cands, t0.Add(time.Duration(i)*time.Second))
				tokens := float64(ch.PrefillTokens)
				truth := (c.DecodeStep + tokens/c.PrefillRate) * math.Pow(tokens/sizeRef, tc.exponent)
				if i >= 3000 {
					errs = append(errs, math.Abs(ch.Estimate/truth-1))
				}
				p.ObserveFirstToken(c.Name, ch.Shape, truth)
			}
			id := p.ids[c.Name]
			if got := p.prefill.sizeExp(id); got < tc.wantSize[0] || got > tc.wantSize[1] {
				t.Errorf("size exponent %.3f, want within %v", got, tc.wantSize)
			}
			slices.Sort(errs)
			if e := errs[len(errs)/2]; e > 0.05 {
				t.Errorf("median estimate error %.3f, want at most 0.05", e)
			}
			p.ForgetCache(c.Name)
			if got := p.prefill.sizeExp(id); got != 0 {
				t.Errorf("size exponent %.3f after a restart, want 0", got)
			}
		})
	}
}

// TestCostLearnsBurstPlace: on a replica whose first tokens take longer for
// the first requests of a session's burst than for the later ones (an
// engine sharing its steps among prefills: the first share them with
// those sent after them), the estimate learns each place's factor and
// follows the replica; on one where the place does not matter it keeps
// them equal; a restart forgets them.
func TestCostLearnsBurstPlace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		place [5]float64 // the engine's prefill time is the serial one x place[i] for the i-th of a burst
	}{
		{"steps shared", [5]float64{1.6, 1.2, 0.9, 0.75, 0.6}},
		{"place does not matter", [5]float64{1, 1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(1)
			c := &cands[0]
			var errs []float64      // relative errors of the estimates, once learned
			var first, last float64 // the last burst's estimates of its first and last request
			for b := range 800 {
				session := fmt.Sprintf("s%d", b%40)
				now := t0.Add(time.Duration(b) * 100 * time.Second)
				for i := range tc.place {
					r := costPrompt(fmt.Sprintf("b%d/r%d/", b, i), 8, 0, session) // fresh blocks
					ch := p.Choose(r, cands, now)
					truth := (c.DecodeStep + float64(ch.PrefillTokens)/c.PrefillRate) * tc.place[i]
					if b >= 600 {
						errs = append(errs, math.Abs(ch.Estimate/truth-1))
					}
					switch i {
					case 0:
						first = ch.Estimate
					case len(tc.place) - 1:
						last = ch.Estimate
					}
					p.ObserveFirstToken(c.Name, ch.Shape, truth)
				}
			}
			slices.Sort(errs)
			if e := errs[len(errs)/2]; e > 0.05 {
				t.Errorf("median estimate error %.3f, want at most 0.05", e)
			}
			want := tc.place[0] / tc.place[len(tc.place)-1]
			if got := first / last; math.Abs(got/want-1) > 0.1 {
				t.Errorf("first / last of a burst estimated %.2f, want %.2f", got, want)
			}
			id := p.ids[c.Name]
			p.ForgetCache(c.Name)
			for b := range burstBuckets {
				if f := p.prefill.burstFactor(id, b); f != 1 {
					t.Errorf("place %d's factor %.3f after a restart, want 1", b, f)
				}
			}
		})
	}
}
