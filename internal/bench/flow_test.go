package bench

import (
	"bytes"
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/workload"
)

// reportJSON is the report's JSON without the wall-clock fields.
func reportJSON(t *testing.T, rep *Report) []byte {
	t.Helper()
	rep.Results = deterministic(rep.Results)
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestFlowControlUnsaturatedChangesNothing: behind flow control, a fleet
// that never saturates routes exactly as without it, and the report is
// byte for byte the same (no flow-control figures: it did nothing).
func TestFlowControlUnsaturatedChangesNothing(t *testing.T) {
	for _, wl := range []string{"oneshot", "agentic"} {
		t.Run(wl, func(t *testing.T) {
			opts := testOptions(t, wl, 4, 3*time.Minute, AllPolicies...)
			off, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			opts.FlowControl = true
			on, err := Run(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range on.Results {
				if r.FlowControl != nil {
					t.Fatalf("%s: the fleet saturated (%+v): not the unsaturated run this test needs", r.Policy, *r.FlowControl)
				}
			}
			if a, b := reportJSON(t, off), reportJSON(t, on); !bytes.Equal(a, b) {
				t.Errorf("flow control on an unsaturated fleet changed the report:\n%s\n%s", a, b)
			}
		})
	}
}

// floodOptions is the flood workload overloading 2 replicas.
func floodOptions(t *testing.T, policies ...string) Options {
	t.Helper()
	return testOptions(t, "flood", 2, 3*time.Minute, policies...)
}

// checkAccounting: every arrival is finished, unfinished, failed, rejected
// or refused by flow control, and the per-tenant and per-priority counts
// add up to the same.
func checkAccounting(t *testing.T, r Result) {
	t.Helper()
	refused := r.FlowControl.RefusedTotal()
	if got := r.Finished + r.Unfinished + r.Failed + r.Rejected + refused; got != r.Requests {
		t.Errorf("%s: finished %d + unfinished %d + failed %d + rejected %d + refused %d != arrived %d",
			r.Policy, r.Finished, r.Unfinished, r.Failed, r.Rejected, refused, r.Requests)
	}
	if len(r.Tenants) > 0 {
		var n, ref int
		for _, ts := range r.Tenants {
			n += ts.Requests
			ref += ts.Refused
		}
		if n != r.Requests || ref != refused {
			t.Errorf("%s: tenants' requests %d and refusals %d, want %d and %d", r.Policy, n, ref, r.Requests, refused)
		}
	}
	if len(r.Priorities) > 0 {
		var n, ref int
		for _, p := range r.Priorities {
			n += p.Requests
			ref += p.Refused
		}
		if n != r.Requests || ref != refused {
			t.Errorf("%s: priorities' requests %d and refusals %d, want %d and %d", r.Policy, n, ref, r.Requests, refused)
		}
	}
}

// TestFlowControlShieldsPoliteTenants: one tenant floods a saturated
// fleet at 10 times the others' rate. Without flow control everyone waits
// in the engines' queues behind the flood; behind it the polite tenants
// are dispatched first (fair shares in tokens) and the flood absorbs the
// wait and the timeouts.
func TestFlowControlShieldsPoliteTenants(t *testing.T) {
	rep, err := Run(context.Background(), floodOptions(t, "cost", "cost+fc"))
	if err != nil {
		t.Fatal(err)
	}
	plain, fc := rep.Results[0], rep.Results[1]
	if fc.Policy != "cost+fc" || plain.FlowControl != nil {
		t.Fatalf("labels %q, %q; flow control without +fc: %v", plain.Policy, fc.Policy, plain.FlowControl)
	}
	f := fc.FlowControl
	// Saturation is sampled at scrapes; requests wait between them (a
	// replica ends a request, one held goes at once), so the sampled share
	// may be nothing while the queue was busy.
	if f == nil || f.Queued == 0 || f.Saturation == nil || f.Saturation.WaitingShare == 0 {
		t.Fatalf("flow control held nothing on a flooded fleet: %+v", f)
	}
	// Controlled delay: a request waits no longer than its backlog has
	// stood, so none waits past standing_after (10s by default).
	if bound := flowcontrol.DefaultConfig().StandingAfter.Seconds(); f.QueueWait.P99 > bound {
		t.Errorf("queue wait P99 %.2fs on a standing backlog, want at most standing_after %.0fs", f.QueueWait.P99, bound)
	}
	for _, r := range rep.Results {
		checkAccounting(t, r)
		if len(r.Tenants) != 4 {
			t.Fatalf("%s: tenants %+v", r.Policy, r.Tenants)
		}
	}
	worstPolite := func(r Result) (p90 float64, refused int) {
		for _, ts := range r.Tenants {
			if ts.Tenant != workload.FloodTenant {
				p90 = max(p90, ts.TTFT.P90)
				refused += ts.Refused
			}
		}
		return p90, refused
	}
	flood := func(r Result) TenantStats {
		for _, ts := range r.Tenants {
			if ts.Tenant == workload.FloodTenant {
				return ts
			}
		}
		t.Fatal("no flood tenant")
		return TenantStats{}
	}
	plainP90, _ := worstPolite(plain)
	fcP90, fcRefused := worstPolite(fc)
	t.Logf("polite P90: %.2fs without flow control, %.2fs with; flood refused %d, polite %d; Jain %.3f -> %.3f",
		plainP90, fcP90, flood(fc).Refused, fcRefused, plain.TenantFairness, fc.TenantFairness)
	if fcP90*5 > plainP90 {
		t.Errorf("polite tenants' worst P90 %.2fs behind flow control, %.2fs without: want at least 5x lower", fcP90, plainP90)
	}
	if fcP90 >= flood(fc).TTFT.P90 {
		t.Errorf("polite P90 %.2fs not below the flooder's %.2fs", fcP90, flood(fc).TTFT.P90)
	}
	if flood(fc).Refused <= fcRefused {
		t.Errorf("the flooder had %d refusals, the polite tenants %d: the flood should absorb them", flood(fc).Refused, fcRefused)
	}
	if !(fc.TenantFairness > plain.TenantFairness) {
		t.Errorf("Jain's index %.3f behind flow control, %.3f without", fc.TenantFairness, plain.TenantFairness)
	}
	if w := f.QueueWait; w.P99 > flowcontrol.DefaultMaxQueueTime.Seconds() || w.Mean > w.P99 {
		t.Errorf("queue waits %+v beyond max_queue_time", w)
	}
}

// TestFlowControlFlagIsTheSpecSuffix: Options.FlowControl runs a policy
// exactly as "+fc" does.
func TestFlowControlFlagIsTheSpecSuffix(t *testing.T) {
	a, err := Run(context.Background(), floodOptions(t, "cost+fc:bounded_load=2"))
	if err != nil {
		t.Fatal(err)
	}
	opts := floodOptions(t, "cost:bounded_load=2")
	opts.FlowControl = true
	b, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ra, rb := deterministic(a.Results)[0], deterministic(b.Results)[0]
	if ra.Policy != "cost+fc:bounded_load=2" {
		t.Errorf("label %q", ra.Policy)
	}
	ra.Policy = rb.Policy
	if ra.FlowControl == nil || !equalJSON(t, ra, rb) {
		t.Errorf("+fc and Options.FlowControl differ:\n%+v\n%+v", ra, rb)
	}
}

// TestFlowControlPriorities: at 3x overload, sheddable requests are
// refused (shed) and high-priority ones go first: their P99 is below the
// default class's, and none of them is refused.
func TestFlowControlPriorities(t *testing.T) {
	opts := testOptions(t, "oneshot", 2, 3*time.Minute, "cost", "cost+fc")
	p := workload.Params{Seed: 1, Duration: opts.Duration, Replicas: 2, Speed: 3}
	opts.NewWorkload = func() (workload.Workload, error) {
		w, err := workload.New("oneshot", p)
		if err != nil {
			return nil, err
		}
		return workload.WithPriorities(w, 1, 0.2, 0.2)
	}
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	byPrio := func(r Result) map[int]PriorityStats {
		m := map[int]PriorityStats{}
		for _, ps := range r.Priorities {
			m[ps.Priority] = ps
		}
		if len(m) != 3 {
			t.Fatalf("%s: priorities %+v", r.Policy, r.Priorities)
		}
		return m
	}
	for _, r := range rep.Results {
		checkAccounting(t, r)
	}
	plain, fc := byPrio(rep.Results[0]), byPrio(rep.Results[1])
	f := rep.Results[1].FlowControl
	t.Logf("P99 high/basic/shed: %.2fs %.2fs %.2fs without flow control, %.2fs %.2fs %.2fs with; refused %v",
		plain[1].TTFT.P99, plain[0].TTFT.P99, plain[-1].TTFT.P99, fc[1].TTFT.P99, fc[0].TTFT.P99, fc[-1].TTFT.P99, f.Refused)
	if f.Refused["shed"] == 0 || f.Refused["shed"] > fc[-1].Refused {
		t.Errorf("shed %d, sheddable class refused %d", f.Refused["shed"], fc[-1].Refused)
	}
	if fc[1].Refused != 0 {
		t.Errorf("%d high-priority requests refused", fc[1].Refused)
	}
	if fc[1].TTFT.P99 >= fc[0].TTFT.P99 {
		t.Errorf("high priority P99 %.2fs not below the default class's %.2fs", fc[1].TTFT.P99, fc[0].TTFT.P99)
	}
	if fc[1].TTFT.P99 >= plain[1].TTFT.P99 {
		t.Errorf("high priority P99 %.2fs behind flow control, %.2fs without", fc[1].TTFT.P99, plain[1].TTFT.P99)
	}
}

// TestFlowControlTimeoutsAndLeftovers: requests that wait max_queue_time
// are refused queue_timeout exactly then; those still held when the drain
// ends are unfinished, their TTFT censored there.
func TestFlowControlTimeoutsAndLeftovers(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		opts := floodOptions(t, "cost+fc")
		opts.Queue = &flowcontrol.Config{MaxQueued: 100_000, MaxQueuedBytes: 1 << 40, MaxQueueTime: 5 * time.Second, MaxTenants: 10}
		rep, err := Run(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Results[0]
		checkAccounting(t, r)
		if r.FlowControl.Refused["queue_timeout"] == 0 || r.FlowControl.QueueWait.P99 > 5 {
			t.Errorf("max_queue_time 5s: %+v", r.FlowControl)
		}
	})
	t.Run("still held", func(t *testing.T) {
		opts := floodOptions(t, "cost+fc")
		opts.Drain = time.Second
		rep, err := Run(context.Background(), opts)
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Results[0]
		checkAccounting(t, r)
		if r.FlowControl.StillQueued == 0 || r.Unfinished < r.FlowControl.StillQueued {
			t.Errorf("a 1s drain left %d held, %d unfinished", r.FlowControl.StillQueued, r.Unfinished)
		}
		if !strings.Contains(tableOf(t, rep), "flow control refused") {
			t.Error("the table does not note the refusals")
		}
	})
}

func tableOf(t *testing.T, rep *Report) string {
	t.Helper()
	var b strings.Builder
	if err := rep.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestJainOverMaxMinShares(t *testing.T) {
	// 30 served among demands 5, 10, 100: 5 and 10 are met, the rest 15.
	fair := maxMinShares([]float64{100, 5, 10}, 30)
	if fair[0] != 15 || fair[1] != 5 || fair[2] != 10 {
		t.Fatalf("max-min shares %v, want [15 5 10]", fair)
	}
	if j := jain([]float64{1, 1, 1}); j != 1 {
		t.Errorf("equal ratios: Jain %v", j)
	}
	if j := jain([]float64{4, 0, 0, 0}); math.Abs(j-0.25) > 1e-12 {
		t.Errorf("all to one of four: Jain %v, want 0.25", j)
	}
}

func TestFlowTablesInReport(t *testing.T) {
	rep, err := Run(context.Background(), floodOptions(t, "cost+fc"))
	if err != nil {
		t.Fatal(err)
	}
	out := tableOf(t, rep)
	for _, want := range []string{"flow control (", "tenants (", "tenant-1", workload.FloodTenant, "Jain"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var h strings.Builder
	if err := rep.WriteHTML(&h); err != nil || !strings.Contains(h.String(), "tenants (") {
		t.Errorf("HTML lacks the tenants table (err %v)", err)
	}
}
