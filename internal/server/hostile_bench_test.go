package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/scrape"
)

// BenchmarkLyingCapacityFlood: a replica whose /metrics claim 2^36 KV
// blocks (2^40 tokens) while a client sends unique 1 MiB prompts through
// serve under the default policy (cost, which indexes every prompt's
// blocks against each replica's capacity). It reports the heap that stays
// live once the flood is over (after a GC), against the same flood on a
// replica claiming an honest 2^19 tokens. Run:
//
//	go test -run '^$' -bench LyingCapacityFlood -benchtime 1x ./internal/server
func BenchmarkLyingCapacityFlood(b *testing.B) {
	const requests, promptBytes = 623, 1 << 20
	for _, claim := range []struct {
		name   string
		tokens float64
	}{
		{"honest", 1 << 19},
		{"lying", 1 << 40},
	} {
		b.Run(claim.name, func(b *testing.B) {
			for range b.N {
				held, took := capacityFlood(b, claim.tokens, requests, promptBytes)
				b.ReportMetric(held, "heap-MB")
				b.ReportMetric(took.Seconds(), "flood-s")
			}
		})
	}
}

// capacityFlood runs serve in front of one replica claiming tokens of KV
// capacity, sends it requests unique prompts of promptBytes each, and
// returns the heap growth that survives a GC after the last answer.
func capacityFlood(b *testing.B, tokens float64, requests, promptBytes int) (float64, time.Duration) {
	b.Helper()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"c","object":"text_completion","model":"`+model+`","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer upstream.Close()
	fake := scrape.NewFake()
	fake.Set(upstream.URL, scrape.Result{Snapshot: balancer.Snapshot{KVCacheTokens: tokens}}, nil)
	fake.SetModels(upstream.URL, []string{model}, nil)
	cfg := testConfig(upstream.URL)
	srv, err := New(cfg, testLogger(), WithFetcher(fake))
	if err != nil {
		b.Fatal(err)
	}
	proxyLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv.UseListeners(proxyLn, adminLn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	client := &http.Client{Timeout: time.Minute}
	url := "http://" + srv.ProxyAddr() + "/v1/completions"

	// Wait until the replica is LIVE with its claim scraped.
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		rs := srv.Balancer().Replicas(time.Now())
		if len(rs) == 1 && rs[0].State == "LIVE" && len(rs[0].Models) == 1 && rs[0].KVCacheTokens > 0 {
			break
		}
		if time.Now().After(end) {
			b.Fatalf("replica not LIVE with its capacity: %+v", rs)
		}
	}

	heap := func() float64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc) / (1 << 20)
	}
	// Words, so the prompt is text the parser counts as many tokens.
	var text strings.Builder
	for i := 0; text.Len() < promptBytes; i++ {
		fmt.Fprintf(&text, "w%d ", i%9973)
	}
	filler := text.String()[:promptBytes-64]
	base := heap()
	b.ResetTimer()
	start := time.Now()
	for i := range requests {
		// A unique first block makes every block of the prompt new.
		body := fmt.Sprintf(`{"model":%q,"max_tokens":1,"prompt":"request %d of the flood %s"}`, model, i, filler)
		res, err := client.Post(url, "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Fatalf("request %d: %d", i, res.StatusCode)
		}
	}
	took := time.Since(start)
	b.StopTimer()
	return heap() - base, took
}
