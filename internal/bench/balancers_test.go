package bench

import (
	"context"
	"testing"
	"time"
)

// Shared state (docs/SHARED_STATE.md): --balancers N runs every policy with N independent cores and
// with N cores sharing state; sharing gives back the affinity that
// independent cores lose, deterministically.
func TestSeveralBalancers(t *testing.T) {
	opts := testOptions(t, "agentic", 4, 5*time.Minute, "cost")
	opts.Balancers = 4
	rep, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Balancers != 4 || len(rep.Results) != 2 {
		t.Fatalf("report: %d balancers, %d results; want 4 and 2", rep.Balancers, len(rep.Results))
	}
	ind, shared := rep.Results[0], rep.Results[1]
	if ind.Policy != "cost x4 independent" || shared.Policy != "cost x4 shared" {
		t.Fatalf("results %q, %q", ind.Policy, shared.Policy)
	}
	for _, r := range rep.Results {
		if r.Requests == 0 || r.Failed > 0 || r.Finished == 0 {
			t.Fatalf("%s: %+v", r.Policy, r)
		}
	}
	if !(shared.PrefixHitRate > ind.PrefixHitRate) || !(shared.PrefillTokens < ind.PrefillTokens) {
		t.Errorf("shared state: hit rate %.3f vs %.3f independent, prefill %d vs %d; want sharing to win both",
			shared.PrefixHitRate, ind.PrefixHitRate, shared.PrefillTokens, ind.PrefillTokens)
	}

	again, err := Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range deterministic(again.Results) {
		if !equalJSON(t, r, deterministic(rep.Results)[i]) {
			t.Errorf("%s: two runs with seed 1 differ", r.Policy)
		}
	}

	opts.NoShareLoad = true
	opts.Policies = []string{"llmlb"}
	rep, err = Run(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Results[1].Policy != "llmlb x4 shared-no-load" {
		t.Fatalf("label %q", rep.Results[1].Policy)
	}
}

func TestSeveralBalancersBadOptions(t *testing.T) {
	opts := testOptions(t, "agentic", 4, time.Minute, "cost")
	opts.Balancers = -1
	if _, err := Run(context.Background(), opts); err == nil {
		t.Fatal("balancers -1 accepted")
	}
}
