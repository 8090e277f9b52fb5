package balancer

import (
	"sync"
	"testing"
)

// TestConcurrentSelectSpreadsEvenly is the WLC blind spot under -race: 64 goroutines
// select at the same instant on one stale scrape snapshot (all idle) across 4
// replicas; the atomic reservation makes each see the others' load.
func TestConcurrentSelectSpreadsEvenly(t *testing.T) {
	b := newFleet(t, 4, nil)
	const n = 64
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		mu    sync.Mutex
		got   = map[string]int{}
		res   = make([]*Reservation, n)
	)
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := b.Select(&Profile{PromptTokens: 800, OutputTokens: 200}, t0)
			if err != nil {
				t.Error(err)
				return
			}
			res[i] = r
			mu.Lock()
			got[r.Replica]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	for _, name := range []string{"a", "b", "c", "d"} {
		if got[name] != n/4 {
			t.Errorf("replica %s got %d reservations, want %d (all: %v)", name, got[name], n/4, got)
		}
	}

	// Releasing concurrently returns every slot.
	for _, r := range res {
		wg.Go(func() { b.Release(r, OutcomeOK, t0) })
	}
	wg.Wait()
	for _, st := range b.Replicas(t0) {
		if st.InFlight != 0 || st.EffectiveRunning != 0 {
			t.Errorf("%s after release: %+v", st.Name, st)
		}
	}
}
