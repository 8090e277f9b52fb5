package bench

import (
	"context"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/workload"
)

// fifoOptions runs the driver on the trivial FIFO engine model, so the
// driver's own logic is tested apart from the real engine's.
func fifoOptions(wl string, replicas int, d time.Duration, policies ...string) Options {
	p := workload.Params{Seed: 7, Duration: d, Replicas: replicas}
	return Options{
		Workload:    wl,
		NewWorkload: func() (workload.Workload, error) { return workload.New(wl, p) },
		Policies:    policies,
		Replicas:    replicas,
		Profile:     engine.Profile{Name: "fifo"},
		Duration:    d,
		Seed:        7,
		Routing:     balancer.DefaultConfig(),
		newEngine:   newFIFOEngine,
	}
}

// TestDriverAccounting checks the driver's bookkeeping: every arrival is
// routed, finished or unfinished; shares sum to one; TTFT <= e2e.
func TestDriverAccounting(t *testing.T) {
	tests := []struct {
		name     string
		workload string
	}{
		{"open loop", "longshort"},
		{"closed loop", "chat"},
		{"bursts", "agentic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep, err := Run(context.Background(), fifoOptions(tt.workload, 3, 2*time.Minute, testPolicies...))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rep.Results {
				t.Logf("%s: %d requests, %d finished, ttft %+v, imbalance %.2f", r.Policy, r.Requests, r.Finished, r.TTFT, r.ImbalanceIndex)
				if r.Requests == 0 {
					t.Fatalf("%s: no requests", r.Policy)
				}
				if got := r.Finished + r.Unfinished + r.Failed + r.Rejected; got != r.Requests {
					t.Errorf("%s: finished %d + unfinished %d + failed %d + rejected %d != arrived %d",
						r.Policy, r.Finished, r.Unfinished, r.Failed, r.Rejected, r.Requests)
				}
				if r.RouteAffinity+r.RouteLoad+r.RouteFallback != r.Requests-r.Failed {
					t.Errorf("%s: routed %d+%d+%d, want %d", r.Policy, r.RouteAffinity, r.RouteLoad, r.RouteFallback, r.Requests-r.Failed)
				}
				if r.TTFT.P50 > r.E2E.P50 || r.TTFT.P99 > r.E2E.P99 {
					t.Errorf("%s: TTFT %+v above e2e %+v", r.Policy, r.TTFT, r.E2E)
				}
				for w, shares := range r.Share {
					var sum float64
					for _, s := range shares {
						sum += s
					}
					if sum != 0 && (sum < 0.999 || sum > 1.001) {
						t.Errorf("%s: window %d shares sum to %v", r.Policy, w, sum)
					}
				}
				if r.ImbalanceIndex < 1 || r.ImbalanceIndex > 3 {
					t.Errorf("%s: imbalance %v outside [1, N]", r.Policy, r.ImbalanceIndex)
				}
			}
		})
	}
}

func TestDriverDeterministicWithFIFOEngine(t *testing.T) {
	opts := fifoOptions("agentic", 4, 3*time.Minute, testPolicies...)
	a, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	opts.Parallel = 1
	b, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ra, rb := deterministic(a.Results), deterministic(b.Results)
	for i := range ra {
		if !equalJSON(t, ra[i], rb[i]) {
			t.Errorf("policy %s differs between runs", ra[i].Policy)
		}
	}
}

// testPolicies are the policies the driver tests run.
var testPolicies = []string{"llmlb"}

// BenchmarkDriverFIFO measures the driver, balancer and workload without the
// real engine: 100 replicas, 10 virtual minutes of agentic load, llmlb.
func BenchmarkDriverFIFO(b *testing.B) {
	opts := fifoOptions("agentic", 100, 10*time.Minute, "llmlb")
	for b.Loop() {
		rep, err := Run(context.Background(), opts)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rep.Results[0].Requests), "requests")
	}
}

// statsCounter counts an engine's Stats calls: one per scrape, one at the
// end of the measured window and one for the result.
type statsCounter struct {
	simEngine
	n *int
}

func (e statsCounter) Stats() engine.Stats { *e.n++; return e.simEngine.Stats() }

// TestLLMDScrapesAtItsRefreshInterval: llm-d's runs read the replicas'
// metrics every 50 ms, as the original polls them, where other policies'
// runs scrape every 3 s; its refresh_interval parameter sets it.
func TestLLMDScrapesAtItsRefreshInterval(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   int // scrapes of each replica in the minute
	}{
		{"rr", 20},
		{"llm-d", 1200},
		{"llm-d:refresh_interval=1s", 60},
	} {
		n := 0
		opts := fifoOptions("chat", 2, time.Minute, tc.policy)
		opts.Parallel = 1
		opts.newEngine = func() simEngine { return statsCounter{newFIFOEngine(), &n} }
		if _, err := Run(context.Background(), opts); err != nil {
			t.Fatal(err)
		}
		// Two replicas, each scraped want times and read twice more.
		if got := n/2 - 2; got != tc.want {
			t.Errorf("%s: %d scrapes of each replica in a minute, want %d", tc.policy, got, tc.want)
		}
	}
}
