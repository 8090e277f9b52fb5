package admin

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/request"
)

// TestDecisionMetrics: every decision counts its prompt tokens on the
// chosen replica; a cost decision also its expected cached tokens and
// expected time to first token.
func TestDecisionMetrics(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(bal, nil)
	m.Decision(time.Time{}, &balancer.Reservation{Replica: "a", Explanation: balancer.Explanation{Policy: "cost", Estimate: 0.25, CachedTokens: 640}},
		&request.Profile{PromptTokens: 1000}, 1)
	m.Decision(time.Time{}, &balancer.Reservation{Replica: "a", Explanation: balancer.Explanation{Policy: "rr"}}, &request.Profile{PromptTokens: 500}, 1)
	m.Decision(time.Time{}, nil, nil, 1) // no reservation: nothing
	if got := testutil.ToFloat64(m.decided.promptTokens.WithLabelValues("a")); got != 1500 {
		t.Errorf("prompt tokens %v, want 1500", got)
	}
	if got := testutil.ToFloat64(m.decided.cachedTokens.WithLabelValues("a")); got != 640 {
		t.Errorf("cached tokens %v, want 640", got)
	}
	if n := testutil.CollectAndCount(m.decided.expectedTTFT, "llmlb_expected_ttft_seconds"); n != 1 {
		t.Errorf("%d expected-TTFT series, want 1", n)
	}
	m.ForgetReplica("a")
	if n := testutil.CollectAndCount(m.decided.promptTokens); n != 0 {
		t.Errorf("%d series after the replica left", n)
	}
}
