// Package hostile is a test kit of misbehaving peers for llmlb's proxy: an
// upstream whose every path answers with a chosen Behavior (hangs, cuts,
// slow drips, bad framing, redirects, protocol upgrades, broken /metrics),
// and client helpers that speak raw TCP (slow bodies, idle connections,
// unclean paths) where net/http's client would refuse or fix the request.
// A new attack is one Behavior, or one row in a test's table.
package hostile

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// Behavior is how the upstream answers one request.
type Behavior func(w http.ResponseWriter, r *http.Request)

// Upstream is an httptest server answering each path with its Behavior;
// a path without one answers 404. It counts the requests per path. Close
// (or the test's end) releases every request still hanging.
type Upstream struct {
	*httptest.Server
	mu       sync.Mutex
	routes   map[string]Behavior
	hits     map[string]int
	released chan struct{}
	once     sync.Once
}

// NewUpstream starts an upstream with routes (path -> Behavior) and
// closes it when the test ends.
func NewUpstream(t testing.TB, routes map[string]Behavior) *Upstream {
	t.Helper()
	u := &Upstream{routes: make(map[string]Behavior), hits: make(map[string]int), released: make(chan struct{})}
	for p, b := range routes {
		u.routes[p] = b
	}
	u.Server = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.Close)
	return u
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	b := u.routes[r.URL.Path]
	u.hits[r.URL.Path]++
	u.mu.Unlock()
	if b == nil {
		http.NotFound(w, r)
		return
	}
	b(w, r.WithContext(withRelease(r.Context(), u.released)))
}

// Set replaces the Behavior of path (at run time: e.g. a replica that
// starts to hang).
func (u *Upstream) Set(path string, b Behavior) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.routes[path] = b
}

// Hits returns how many requests reached path.
func (u *Upstream) Hits(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[path]
}

// Release ends every request hanging now or later (Hang, HangAfterHeaders).
func (u *Upstream) Release() { u.once.Do(func() { close(u.released) }) }

// Close releases the hanging requests and stops the server.
func (u *Upstream) Close() {
	u.Release()
	u.Server.CloseClientConnections()
	u.Server.Close()
}

type releaseKey struct{}

func withRelease(ctx context.Context, ch chan struct{}) context.Context {
	return context.WithValue(ctx, releaseKey{}, ch)
}

// wait blocks until the client goes away or the upstream is released.
func wait(r *http.Request) {
	ch, _ := r.Context().Value(releaseKey{}).(chan struct{})
	select {
	case <-r.Context().Done():
	case <-ch:
	}
}

// JSON answers status with body as application/json.
func JSON(status int, body string) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// Text answers status with body as text/plain: e.g. a /metrics that is
// not Prometheus text, or a 500.
func Text(status int, body string) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
}

// Metrics answers a vLLM-like /metrics with an idle engine.
func Metrics() Behavior {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n")
	}
}

// Events returns n SSE chunk events, and the [DONE] event when done.
func Events(n int, done bool) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "data: {\"n\":%d}\n\n", i+1)
	}
	if done {
		b.WriteString("data: [DONE]\n\n")
	}
	return b.String()
}

// SSE streams n events (and [DONE] when done) with chunked framing and
// ends properly.
func SSE(n int, done bool) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, Events(n, done))
	}
}

// raw hijacks the connection, writes s as the whole response and closes
// the connection: the framing is whatever s says.
func raw(s string) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		_, _ = brw.WriteString(s)
		_ = brw.Flush()
	}
}

// CloseDelimitedSSE streams n events (and [DONE] when done) with neither
// Content-Length nor chunked framing, then closes the connection: the HTTP
// framing says the body ended cleanly, only [DONE] tells a cut.
func CloseDelimitedSSE(n int, done bool) Behavior {
	return raw("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + Events(n, done))
}

// CutChunked streams n events in chunked framing and closes the connection
// without the terminating zero-length chunk.
func CutChunked(n int) Behavior {
	ev := Events(n, false)
	return raw(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev))
}

// ShortBody announces a Content-Length longer than the JSON body it sends,
// then closes the connection.
func ShortBody() Behavior {
	body := `{"id":"cmpl-1","choices":[`
	return raw(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body)+100, body))
}

// Hang reads the request and never answers (until released or the client
// goes away): a SIGSTOPped replica, or one whose API hangs.
func Hang() Behavior {
	return func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		wait(r)
	}
}

// HangAfterHeaders sends SSE headers and n events, then nothing more.
func HangAfterHeaders(n int) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, Events(n, false))
		_ = http.NewResponseController(w).Flush()
		wait(r)
	}
}

// Drip streams n events one every interval, then [DONE]: a slow but live
// replica.
func Drip(n int, interval time.Duration) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		for i := range n {
			fmt.Fprintf(w, "data: {\"n\":%d}\n\n", i+1)
			_ = rc.Flush()
			select {
			case <-time.After(interval):
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}
}

// Redirect answers 302 to location (e.g. /metrics pointing at another host).
func Redirect(location string) Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, location, http.StatusFound)
	}
}

// WebSocketEcho accepts a WebSocket upgrade and echoes every message until
// the peer closes (vLLM's /v1/realtime is a WebSocket).
func WebSocketEcho() Behavior {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, msg); err != nil {
				return
			}
		}
	}
}

// readResponse reads one HTTP response from conn.
func readResponse(conn net.Conn, req *http.Request) (*http.Response, error) {
	return http.ReadResponse(bufio.NewReader(conn), req)
}
