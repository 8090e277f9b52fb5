package admin

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// TestCachedSeriesFollowForget: a replica forgotten and added again under
// the same name counts into its new series, not into the deleted ones the
// cache held, and the old counts are gone.
func TestCachedSeriesFollowForget(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(bal, nil)
	event := func() {
		m.Request("a", balancer.ReasonLoad, 200)
		m.FirstByte("a", 30*time.Millisecond)
		m.Decision(time.Time{}, &balancer.Reservation{Replica: "a", Explanation: balancer.Explanation{Estimate: 0.25, CachedTokens: 5}},
			&request.Profile{PromptTokens: 10}, 1)
	}
	event()
	event()
	m.ForgetReplica("a")
	if n := testutil.CollectAndCount(m.requests) + testutil.CollectAndCount(m.firstByte) +
		testutil.CollectAndCount(m.decided.promptTokens); n != 0 {
		t.Fatalf("%d series left after the replica left", n)
	}
	m.InitReplica("a")
	event()
	if got := testutil.ToFloat64(m.requests.WithLabelValues("a", "load", "200")); got != 1 {
		t.Errorf("requests %v after the replica came back, want 1", got)
	}
	if got := testutil.ToFloat64(m.decided.promptTokens.WithLabelValues("a")); got != 10 {
		t.Errorf("prompt tokens %v after the replica came back, want 10", got)
	}
	if got := testutil.ToFloat64(m.decided.cachedTokens.WithLabelValues("a")); got != 5 {
		t.Errorf("cached tokens %v after the replica came back, want 5", got)
	}
	if n := testutil.CollectAndCount(m.firstByte); n != 1 {
		t.Errorf("%d first-byte series, want 1", n)
	}
}

// TestCompletionSeries: the cached children count as WithLabelValues did,
// and a route outside the known reasons makes only the series it counts in.
func TestCompletionSeries(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(bal, nil)
	u := openai.TokenCounts{PromptTokens: 7, CompletionTokens: 3}
	m.Completion("m", balancer.ReasonLoad, -1, time.Second, u)
	m.Completion("m", balancer.ReasonLoad, time.Millisecond, time.Second, u)
	if got := testutil.ToFloat64(m.tokens.WithLabelValues(OtherModel, "prompt")); got != 14 {
		t.Errorf("prompt tokens %v, want 14", got)
	}
	if got := testutil.ToFloat64(m.tokens.WithLabelValues(OtherModel, "completion")); got != 6 {
		t.Errorf("completion tokens %v, want 6", got)
	}
	m.Completion("m", "odd", -1, time.Second, openai.TokenCounts{})
	if n := testutil.CollectAndCount(m.ttft); n != 1 {
		t.Errorf("%d time-to-first-token series, want 1 (none for route odd)", n)
	}
}
