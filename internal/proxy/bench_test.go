package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/testutil/canned"
)

// BenchmarkProxy compares a request sent straight to an upstream with the
// same request sent through the proxy (parse, select, reserve, relay,
// release), on loopback. The ratio proxied/direct is the proxy's overhead;
// see docs/benchmarks/LAB-2026.md "Proxy overhead".
func BenchmarkProxy(b *testing.B) {
	const sseChunks = 32
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.RawQuery, "sse") {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range sseChunks {
				fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`)
	}))
	defer upstream.Close()

	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "up", URL: upstream.URL, Models: []string{"m"}}, time.Now()); err != nil {
		b.Fatal(err)
	}
	p, err := New(Options{Balancer: bal, Request: testRequestConfig, Proxy: defaultProxyConfig()})
	if err != nil {
		b.Fatal(err)
	}
	front := httptest.NewServer(p)
	defer front.Close()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	body := `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 40) + `"},{"role":"user","content":"hello"}]}`
	post := func(b *testing.B, url string) {
		res, err := client.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Fatalf("status %d", res.StatusCode)
		}
	}
	// Each iteration sends one request direct and one through the proxy,
	// alternating, so background load on the machine hits both alike; the
	// reported metrics are per request, and ratio = proxied / direct.
	for _, c := range []struct{ name, query string }{{"json", ""}, {"sse-32-chunks", "?sse"}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var direct, proxied time.Duration
			n := 0
			for b.Loop() {
				t0 := time.Now()
				post(b, upstream.URL+"/v1/chat/completions"+c.query)
				t1 := time.Now()
				post(b, front.URL+"/v1/chat/completions"+c.query)
				direct += t1.Sub(t0)
				proxied += time.Since(t1)
				n++
			}
			b.ReportMetric(float64(direct.Microseconds())/float64(n), "direct-us/req")
			b.ReportMetric(float64(proxied.Microseconds())/float64(n), "proxied-us/req")
			b.ReportMetric(float64(proxied-direct)/float64(n)/1e3, "overhead-us/req")
			b.ReportMetric(float64(proxied)/float64(direct), "ratio")
		})
	}
}

// cannedBody is what the in-memory replica of BenchmarkProxyHandler answers:
// it measures the proxy's own work without any network hop.
const cannedBody = `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}`

// BenchmarkProxyHandler is the proxy's own cost per request: read, parse,
// select and reserve, rewrite, relay, release (no sockets).
func BenchmarkProxyHandler(b *testing.B) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"a", "b", "c", "d"} {
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name + ":8000", Models: []string{"m"}}, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	p, err := New(Options{Balancer: bal, Request: testRequestConfig, Proxy: defaultProxyConfig(), Transport: canned.Transport{Body: cannedBody}})
	if err != nil {
		b.Fatal(err)
	}
	body := `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"` +
		strings.Repeat("You are a helpful assistant. ", 40) + `"},{"role":"user","content":"hello"}]}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("X-Session-Id", "s1")
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d", w.Code)
		}
	}
}
