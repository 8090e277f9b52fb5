package admin

import (
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// BenchmarkRequestMetrics is what one relayed request records: its
// decision, first byte, answer and completion (latency and tokens).
func BenchmarkRequestMetrics(b *testing.B) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "up", URL: "http://up:8000", Models: []string{"m"}}, time.Now()); err != nil {
		b.Fatal(err)
	}
	m := NewMetrics(bal, time.Now)
	m.InitReplica("up")
	res := &balancer.Reservation{Replica: "up", Reason: balancer.ReasonLoad, Explanation: balancer.Explanation{Estimate: 0.05, CachedTokens: 16}}
	prof := &request.Profile{Model: "m", PromptTokens: 20}
	u := openai.TokenCounts{PromptTokens: 20, CompletionTokens: 9}
	b.ReportAllocs()
	for b.Loop() {
		m.Decision(time.Time{}, res, prof, 1)
		m.FirstByte("up", 3*time.Millisecond)
		m.Request("up", balancer.ReasonLoad, 200)
		m.Completion("m", balancer.ReasonLoad, -1, 4*time.Millisecond, u)
	}
}
