package server

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/admin"
	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/testutil/canned"
	"github.com/llmlb/llmlb/internal/ui"
)

// cannedBody is the chat completion the in-memory replica answers.
const cannedBody = `{"id":"x","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}],"usage":{"prompt_tokens":20,"completion_tokens":9,"total_tokens":29}}`

// BenchmarkServeHandler is the proxy listener's own work per request, as
// serve wires it (request id, the observer's usage and latency metrics,
// flow control's gate at its defaults, the proxy with its metrics and the
// dashboard's records), without sockets: the JSON request of
// scripts/proxybench.sh answered by an in-memory replica.
func BenchmarkServeHandler(b *testing.B) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "up", URL: "http://up:8000", Models: []string{"m"}}, time.Now()); err != nil {
		b.Fatal(err)
	}
	m := admin.NewMetrics(bal, time.Now)
	m.InitReplica("up")
	dash := ui.New(ui.Options{Balancer: bal, Now: time.Now})
	p, err := proxy.New(proxy.Options{Balancer: bal, Request: request.DefaultConfig(), Proxy: proxy.Config{RouteHeaders: true},
		Transport: canned.Transport{Body: cannedBody}, Metrics: recorders{m, dash},
		Gate: admission.New(bal, flowcontrol.DefaultConfig()),
		Decisions: func(at time.Time, res *balancer.Reservation, prof *request.Profile, attempt int) {
			dash.Decision(at, res, prof, attempt)
			m.Decision(at, res, prof, attempt)
		}})
	if err != nil {
		b.Fatal(err)
	}
	h := &observed{next: p, metrics: m, log: slog.New(slog.DiscardHandler), now: time.Now}
	const body = `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// BenchmarkFloorHandler is BenchmarkServeHandler's request through the
// floor scripts/proxybench.sh compares llmlb with (goproxy: a bare
// httputil.ReverseProxy), over the same in-memory replica: what a Go proxy
// costs before llmlb adds anything.
func BenchmarkFloorHandler(b *testing.B) {
	target, err := url.Parse("http://up:8000")
	if err != nil {
		b.Fatal(err)
	}
	rp := &httputil.ReverseProxy{
		Rewrite:    func(pr *httputil.ProxyRequest) { pr.SetURL(target) },
		Transport:  canned.Transport{Body: cannedBody},
		BufferPool: &floorBuffers{},
	}
	const body = `{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}`
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		rp.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body)
		}
	}
}

// floorBuffers is goproxy's pool of 32 KiB copy buffers.
type floorBuffers struct{ p sync.Pool }

func (f *floorBuffers) Get() []byte {
	if v, ok := f.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

func (f *floorBuffers) Put(b []byte) { f.p.Put(&b) }
