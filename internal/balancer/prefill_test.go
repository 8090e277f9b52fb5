package balancer

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestFirstTokensTeachCostsPrefillModel: the balancer hands each first
// token back to cost with the decision's estimate, so that first tokens
// twice as slow as estimated raise later estimates, and the decision log
// shows the model it priced each candidate with.
func TestFirstTokensTeachCostsPrefillModel(t *testing.T) {
	b := costFleet(t, 2)
	b.SetExplain(true)
	first, err := b.Select(costProfile("first", 100, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	if d := first.Explanation.Detail; !strings.Contains(d, "prefill_scale=1.00 prefill_shared=0.00") {
		t.Fatalf("first decision's detail %q: want the prior prefill model", d)
	}
	b.Release(first, OutcomeOK, t0)
	now := t0
	for i := range 60 {
		now = now.Add(time.Minute) // nothing pending from the last one
		res, err := b.Select(costProfile(fmt.Sprintf("f%d", i), 100, 0), now)
		if err != nil {
			t.Fatal(err)
		}
		at := now.Add(time.Duration(2 * res.Explanation.Estimate * float64(time.Second)))
		b.FirstToken(res, at)
		b.Release(res, OutcomeOK, at)
	}
	last, err := b.Select(costProfile("last", 100, 0), now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if r := last.Explanation.Estimate / first.Explanation.Estimate; r < 1.5 {
		t.Errorf("estimate %.4fs after first tokens twice as slow, %.4fs before: want it to have grown", last.Explanation.Estimate, first.Explanation.Estimate)
	}
	if d := last.Explanation.Detail; strings.Contains(d, "prefill_scale=1.00") {
		t.Errorf("last decision's detail %q: want the learned scale", d)
	}
}

// TestCachedTokensTeachCostTheRecomputedShare: the cached tokens a replica
// reports for a request sent beside the prefill of its own prefix reach
// cost once per request, which learns from them the share of such a hit the
// replica computes again (the decision log's recomputed_share).
func TestCachedTokensTeachCostTheRecomputedShare(t *testing.T) {
	b := costFleet(t, 1)
	b.SetExplain(true)
	first, err := b.Select(costProfile("x", 100, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.Select(costProfile("x", 100, 2), t0)
	if err != nil {
		t.Fatal(err)
	}
	if d := second.Explanation.Detail; first.Replica != second.Replica || !strings.Contains(d, "unscheduled_hit=1600 recomputed_share=0.000") {
		t.Fatalf("second decision's detail %q: want the first's prefix as an unscheduled hit", d)
	}
	b.Cached(second, 0) // it computed all of the prefix again
	b.Cached(second, 0) // once per request
	third, err := b.Select(costProfile("x", 100, 3), t0)
	if err != nil {
		t.Fatal(err)
	}
	if d := third.Explanation.Detail; !strings.Contains(d, "recomputed_share=0.031") {
		t.Fatalf("third decision's detail %q: want the share learned from one report (1/32)", d)
	}
}

// TestCanceledRequestLeavesThePendingPrefixes: a request whose client goes
// away before its first token is no longer followed as computing its
// prefix (else a client cancelling at once would fill the list with
// prefixes nothing computes until they age out).
func TestCanceledRequestLeavesThePendingPrefixes(t *testing.T) {
	b := costFleet(t, 1)
	b.SetExplain(true)
	first, err := b.Select(costProfile("x", 100, 0), t0)
	if err != nil {
		t.Fatal(err)
	}
	b.Release(first, OutcomeCanceled, t0)
	second, err := b.Select(costProfile("x", 100, 2), t0)
	if err != nil {
		t.Fatal(err)
	}
	if d := second.Explanation.Detail; strings.Contains(d, "unscheduled_hit=1600") {
		t.Fatalf("second decision's detail %q: the cancelled request's prefix is still pending", d)
	}
}
