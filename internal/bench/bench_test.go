package bench

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/workload"
)

// testOptions is a small fleet on a short run of a synthetic workload.
func testOptions(t *testing.T, wl string, replicas int, d time.Duration, policies ...string) Options {
	t.Helper()
	prof, err := engine.Lookup(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	p := workload.Params{Seed: 1, Duration: d, Replicas: replicas}
	return Options{
		Workload:    wl,
		NewWorkload: func() (workload.Workload, error) { return workload.New(wl, p) },
		Policies:    policies,
		Replicas:    replicas,
		Profile:     prof,
		Duration:    d,
		Seed:        1,
		Routing:     balancer.DefaultConfig(),
	}
}

// deterministic strips the fields that depend on the machine, not the seed.
func deterministic(rs []Result) []Result {
	out := make([]Result, len(rs))
	for i, r := range rs {
		r.WallSeconds, r.SimulatedSecPerWall = 0, 0
		out[i] = r
	}
	return out
}

func TestRunIsDeterministic(t *testing.T) {
	tests := []struct {
		name     string
		workload string
		duration time.Duration
	}{
		{"open loop", "oneshot", time.Minute},
		{"closed loop with sessions", "agentic", 2 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions(t, tt.workload, 3, tt.duration, AllPolicies...)
			a, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			opts.Parallel = 1 // scheduling must not matter either
			b, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			ra, rb := deterministic(a.Results), deterministic(b.Results)
			for i := range ra {
				if !equalJSON(t, ra[i], rb[i]) {
					t.Errorf("policy %s: two runs with seed 1 differ:\n%+v\n%+v", ra[i].Policy, ra[i], rb[i])
				}
				if ra[i].Requests == 0 || ra[i].Finished == 0 {
					t.Errorf("policy %s: nothing ran: %+v", ra[i].Policy, ra[i])
				}
			}
		})
	}
}

// TestLLMLBBeatsRoundRobinOnLongshort is the longshort workload's point: occasional 100K
// prefills amid short requests; round-robin queues short requests behind
// them, llmlb's no-wait and token-weighted load do not.
func TestLLMLBBeatsRoundRobinOnLongshort(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10-minute virtual run")
	}
	opts := testOptions(t, "longshort", 4, 10*time.Minute, "rr", "llmlb")
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	rr, lb := rep.Results[0], rep.Results[1]
	t.Logf("P99 TTFT: rr %.3fs, llmlb %.3fs (%.1fx)", rr.TTFT.P99, lb.TTFT.P99, rr.TTFT.P99/lb.TTFT.P99)
	if lb.TTFT.P99 >= rr.TTFT.P99 {
		t.Fatalf("llmlb P99 TTFT %.3fs is not below rr's %.3fs", lb.TTFT.P99, rr.TTFT.P99)
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	opts := testOptions(t, "agentic", 4, time.Hour, "rr", "llmlb")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, opts); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestFlapRunsThroughHealth: a flapping replica fails scrapes and refuses
// requests; the core ejects it (health on the serve code path) and the
// driver retries refused requests elsewhere.
func TestFlapRunsThroughHealth(t *testing.T) {
	opts := testOptions(t, "longshort", 3, 3*time.Minute, "llmlb")
	opts.Flaps = []Flap{{Replica: "replica-2", Period: 15 * time.Second}}
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Results[0]
	if r.Ejections == 0 {
		t.Errorf("no ejections with a flapping replica: %+v", r)
	}
	if r.Failed != 0 {
		t.Errorf("%d requests failed with two healthy replicas left", r.Failed)
	}
}

// TestSlowReplica: round-robin sends a slow replica as many requests as the
// others, and each of its steps takes Factor times longer, so its requests
// wait longer for their first token; the report names it.
func TestSlowReplica(t *testing.T) {
	opts := testOptions(t, "oneshot", 2, 3*time.Minute, "rr")
	opts.Slow = []Slow{{Replica: "replica-2", Factor: 3}}
	opts.KeepRequests = true
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(rep.Slow, ","); got != "replica-2:3" {
		t.Errorf("report's slow replicas %q, want replica-2:3", got)
	}
	var ttft [2]float64
	var n [2]int
	for _, r := range rep.Results[0].RequestLog {
		i := 0
		if r.Replica == "replica-2" {
			i = 1
		}
		ttft[i] += r.TTFT
		n[i]++
	}
	if n[0] == 0 || n[1] == 0 {
		t.Fatalf("requests per replica %v: round-robin used both", n)
	}
	fast, slow := ttft[0]/float64(n[0]), ttft[1]/float64(n[1])
	if slow < 2*fast {
		t.Errorf("mean TTFT %.3fs on the 3x slower replica, %.3fs on the other: want at least twice", slow, fast)
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	good := testOptions(t, "longshort", 2, time.Minute, "rr")
	tests := []struct {
		name   string
		modify func(*Options)
		want   string
	}{
		{"no workload", func(o *Options) { o.NewWorkload = nil }, "no workload"},
		{"negative replicas", func(o *Options) { o.Replicas = -1 }, "replicas"},
		{"no duration", func(o *Options) { o.Duration = 0 }, "duration"},
		{"duplicate policy", func(o *Options) { o.Policies = []string{"rr", "rr"} }, "twice"},
		{"flap of an unknown replica", func(o *Options) { o.Flaps = []Flap{{"replica-9", time.Second}} }, "unknown replica"},
		{"unknown policy", func(o *Options) { o.Policies = []string{"magic"} }, "magic"},
		{"slow unknown replica", func(o *Options) { o.Slow = []Slow{{"replica-9", 2}} }, "unknown replica"},
		{"slow factor below 1", func(o *Options) { o.Slow = []Slow{{"replica-1", 0.5}} }, "factor"},
		{"slow replica twice", func(o *Options) { o.Slow = []Slow{{"replica-1", 2}, {"replica-1", 3}} }, "twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := good
			tt.modify(&o)
			_, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

// BenchmarkRun is the benchmark's speed target: all policies on one workload, 4
// replicas, 30 virtual minutes (target: under 60 s a run on 2 cores).
// BENCHMARKS.md records the figures and the 100-replica run.
func BenchmarkRun(b *testing.B) {
	for _, wl := range []string{"agentic", "longshort"} {
		b.Run(wl, func(b *testing.B) {
			prof, err := engine.Lookup(engine.DefaultProfile)
			if err != nil {
				b.Fatal(err)
			}
			p := workload.Params{Seed: 1, Duration: 30 * time.Minute, Replicas: 4}
			opts := Options{
				Workload:    wl,
				NewWorkload: func() (workload.Workload, error) { return workload.New(wl, p) },
				Replicas:    4,
				Profile:     prof,
				Duration:    30 * time.Minute,
				Seed:        1,
			}
			for b.Loop() {
				rep, err := Run(context.Background(), opts)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(rep.DurationSeconds*float64(len(rep.Results)), "virtual-s/op")
			}
		})
	}
}

// TestReportMetrics: on an open-loop workload every policy is offered the
// same requests, so the cache ceiling is the same for all and no policy's
// hit rate exceeds it; on longshort the TTFT classes add up, short requests
// are faster than long ones and the slowdown quantiles are ordered.
func TestReportMetrics(t *testing.T) {
	run := func(wl string) *Report {
		rep, err := Run(context.Background(), testOptions(t, wl, 3, 2*time.Minute, "rr", "sticky", "prefix-tree"))
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	t.Run("cache ceiling", func(t *testing.T) {
		rep := run("oneshot")
		ceiling := rep.Results[0].CacheCeiling
		if ceiling <= 0 || ceiling > 1 {
			t.Fatalf("cache ceiling %v", ceiling)
		}
		for _, r := range rep.Results {
			if r.CacheCeiling != ceiling {
				t.Errorf("%s: ceiling %v, %s's %v: the same requests must give the same ceiling", r.Policy, r.CacheCeiling, rep.Results[0].Policy, ceiling)
			}
			if r.PrefixHitRate > r.CacheCeiling {
				t.Errorf("%s: hit rate %v above the ceiling %v", r.Policy, r.PrefixHitRate, r.CacheCeiling)
			}
		}
	})
	t.Run("classes and slowdown", func(t *testing.T) {
		for _, r := range run("longshort").Results {
			if r.ShortRequests+r.LongRequests != r.Requests-r.Failed-r.Rejected || r.ShortRequests == 0 || r.LongRequests == 0 {
				t.Errorf("%s: %d short + %d long, %d requests", r.Policy, r.ShortRequests, r.LongRequests, r.Requests)
			}
			if r.TTFTShort.P50 >= r.TTFTLong.P50 {
				t.Errorf("%s: short TTFT p50 %v not below long %v", r.Policy, r.TTFTShort.P50, r.TTFTLong.P50)
			}
			if s := r.TTFTSlowdown; s.P50 < 0.5 || s.P50 > s.P90 || s.P90 > s.P99 {
				t.Errorf("%s: slowdown %+v", r.Policy, s)
			}
		}
	})
}
