package policy

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// FuzzCostChoose drives policy cost through sequences of decisions on
// fleets whose candidates carry extreme but valid values (what the balancer
// can hand it: rates within its plausibility bounds, queues from empty to
// absurd), with sessions whose requests come together or apart (bursts):
// every choice is a candidate, its token split adds up and its estimate is
// a finite, non-negative number of seconds.
func FuzzCostChoose(f *testing.F) {
	f.Add([]byte{3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	f.Add([]byte{1, 255, 255, 255, 255, 0, 0, 0, 0})
	f.Add([]byte{8, 9, 200, 3, 0, 0, 17, 4, 250, 1, 1, 1, 99, 0, 0, 128, 64, 32, 16, 8, 4, 2, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		n := 1 + next()%8
		p, err := NewCost(DefaultCostConfig())
		if err != nil {
			t.Fatal(err)
		}
		cands := make([]Candidate, n)
		for i := range cands {
			cands[i] = Candidate{Name: fmt.Sprint("r", i), Live: true, KVCacheTokens: 16 * (1 + next()*next()),
				PrefillRate: math.Pow(10, float64(1+next()%7)), DecodeStep: math.Pow(10, -float64(next()%6)),
				MeanOutput: float64(next() * 10)}
		}
		now := t0
		for len(data) > 0 {
			c := &cands[next()%n]
			c.InFlight = next()
			c.PendingPrefill = float64(next()) * math.Pow(10, float64(next()%10))
			c.PendingRequests = next() % 4
			c.ScrapedRunning, c.ScrapedWaiting = float64(next()), float64(next()%8)
			c.HeldPrefill = float64(next()) * 1000
			shared, own := next()%64, next()%16
			session := ""
			if s := next() % 4; s > 0 {
				session = fmt.Sprint("s", s)
			}
			r := costPrompt(fmt.Sprint("root", next()%3), shared, own, session)
			if next()%5 == 0 {
				r.PromptBlocks = nil // a prompt without blocks
			}
			now = now.Add(time.Duration(next()%4) * time.Duration(math.Pow(10, float64(next()%10))))
			ch := p.Choose(r, cands, now)
			if ch.Index < 0 || ch.Index >= n {
				t.Fatalf("chose %d of %d candidates", ch.Index, n)
			}
			if ch.CachedTokens < 0 || ch.PrefillTokens < 0 || ch.CachedTokens+ch.PrefillTokens != r.PromptTokens {
				t.Fatalf("cached %d + prefill %d != prompt %d", ch.CachedTokens, ch.PrefillTokens, r.PromptTokens)
			}
			if math.IsNaN(ch.Estimate) || math.IsInf(ch.Estimate, 0) || ch.Estimate < 0 {
				t.Fatalf("estimate %v", ch.Estimate)
			}
		}
	})
}
