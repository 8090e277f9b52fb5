package admin

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
)

// A replica advertising 20,000 models made one /metrics scrape 203 MB:
// every model got its own latency and token series. The per-model series
// are capped at MaxModelSeries; the rest count as "other".
func TestModelSeriesCapped(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a:8000"}, t0); err != nil {
		t.Fatal(err)
	}
	models := make([]string, 20000)
	for i := range models {
		models[i] = fmt.Sprintf("m%05d", i)
	}
	long := "m00001" + strings.Repeat("x", MaxModelLabelBytes)
	models[1] = long
	bal.SetModels("a", models)
	m := NewMetrics(bal, func() time.Time { return t0 })

	tests := []struct {
		model, want string
	}{
		{"m00000", "m00000"}, // among the first MaxModelSeries (sorted)
		{fmt.Sprintf("m%05d", MaxModelSeries-1), fmt.Sprintf("m%05d", MaxModelSeries-1)},
		{"m19999", OtherModel},             // served, but beyond the cap
		{long, OtherModel},                 // served, but too long a label
		{"nobody-serves-this", OtherModel}, // served by no replica
	}
	for _, tc := range tests {
		if got := m.ModelLabel(tc.model); got != tc.want {
			t.Errorf("ModelLabel(%q) = %q, want %q", tc.model, got, tc.want)
		}
	}
	m.Completion("m19999", balancer.ReasonLoad, time.Second, 2*time.Second, openai.TokenCounts{PromptTokens: 5})

	rec := httptest.NewRecorder()
	start := time.Now()
	promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	took := time.Since(start)
	body := rec.Body.Bytes()
	t.Logf("/metrics with 20000 models: %d bytes in %v", len(body), took)
	if len(body) > 2<<20 {
		t.Errorf("/metrics is %d bytes, want under 2 MiB", len(body))
	}
	if bytes.Contains(body, []byte(`model="m19999"`)) {
		t.Error("a model beyond the cap has its own series")
	}
	if !strings.Contains(string(body), `llmlb_tokens_total{kind="prompt",model="other"} 5`) {
		t.Error("tokens of a model beyond the cap not counted under other")
	}
}
