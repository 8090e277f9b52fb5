package admin

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
)

// BenchmarkMetricsManyModels: one /metrics scrape while the fleet
// advertises 20,000 models and requests have completed for the first
// MaxModelSeries + 1 of them (every series the cap allows, and other: the
// worst case, as more models only add to other). Reports the page's size
// besides the time and allocations per scrape.
//
//	go test -run '^$' -bench MetricsManyModels -benchmem ./internal/admin
func BenchmarkMetricsManyModels(b *testing.B) {
	m, models := metricsWithModels(b, 20000)
	for _, model := range models[:MaxModelSeries+1] {
		m.Completion(model, balancer.ReasonLoad, time.Second, 2*time.Second, openai.TokenCounts{PromptTokens: 5, CompletionTokens: 7})
	}
	h := promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{})
	var size int
	b.ResetTimer()
	for range b.N {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		size = rec.Body.Len()
	}
	b.ReportMetric(float64(size)/1024, "page-KiB")
}

// BenchmarkCompletionBeyondTheCap: what recording one completed request
// costs for a model counted as other, with a fleet advertising n models.
//
//	go test -run '^$' -bench CompletionBeyondTheCap -benchmem ./internal/admin
func BenchmarkCompletionBeyondTheCap(b *testing.B) {
	for _, n := range []int{100, 1000, 20000} {
		b.Run(fmt.Sprintf("models=%d", n), func(b *testing.B) {
			m, models := metricsWithModels(b, n)
			last := models[n-1]
			b.ResetTimer()
			for range b.N {
				m.Completion(last, balancer.ReasonLoad, time.Second, 2*time.Second, openai.TokenCounts{PromptTokens: 5})
			}
		})
	}
}

// metricsWithModels returns the metrics of a one-replica fleet that
// advertises n models, and those models, sorted.
func metricsWithModels(b *testing.B, n int) (*Metrics, []string) {
	b.Helper()
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a:8000"}, t0); err != nil {
		b.Fatal(err)
	}
	models := make([]string, n)
	for i := range models {
		models[i] = fmt.Sprintf("m%05d", i)
	}
	bal.SetModels("a", models)
	return NewMetrics(bal, func() time.Time { return t0 }), models
}
