package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
)

// writeCounter counts the writes on every connection it dialed.
type writeCounter struct {
	mu     sync.Mutex
	writes int
}

type countingConn struct {
	net.Conn
	c *writeCounter
}

func (c countingConn) Write(p []byte) (int, error) {
	c.c.mu.Lock()
	c.c.writes++
	c.c.mu.Unlock()
	return c.Conn.Write(p)
}

func (w *writeCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, c: w}, nil
}

func (w *writeCounter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}

// proxyWith is a Proxy to one replica at url through transport tr.
func proxyWith(t *testing.T, url string, tr http.RoundTripper) *Proxy {
	t.Helper()
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: url, Models: []string{"m"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Balancer: bal, Request: testRequestConfig, Proxy: defaultProxyConfig(), Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRequestLeavesInOneWrite: the body is read whole before it
// is routed, so the request to the replica (headers and body) goes out in
// one write, with its Content-Length, not headers first and body after.
func TestRequestLeavesInOneWrite(t *testing.T) {
	got := make(chan string, 3)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- strconv.FormatInt(r.ContentLength, 10) + " " + string(b)
		io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	wc := &writeCounter{}
	tr := NewTransport(defaultProxyConfig())
	tr.DialContext = wc.dial
	p := proxyWith(t, up.URL, tr)
	for i := range 3 {
		if w := post(t, p, chatBody, nil); w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d %s", i, w.Code, w.Body)
		}
		if want := strconv.Itoa(len(chatBody)) + " " + chatBody; <-got != want {
			t.Fatalf("request %d: the replica did not get %q", i, want)
		}
	}
	if n := wc.count(); n != 3 {
		t.Errorf("%d writes to the replica for 3 requests on a kept-alive connection, want 3", n)
	}
}

// flushCounter is a ResponseWriter that counts flushes and notes how
// much of the body had been written at each.
type flushCounter struct {
	*httptest.ResponseRecorder
	flushes int
	at      []int
}

func (f *flushCounter) Flush() {
	f.flushes++
	f.at = append(f.at, f.Body.Len())
	f.ResponseRecorder.Flush()
}

// TestOnlyStreamsAreFlushed: a JSON answer of known length is
// written once, whole (no flush per write, no flush timer): one flush once
// all of it is relayed, which sends it before the proxy's bookkeeping
// rather than when the handler ends; an SSE answer is flushed as it is
// relayed (TestClientGoneMidStreamReleases shows its first event arrives
// while the replica still holds the stream).
func TestOnlyStreamsAreFlushed(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Has("sse") {
			w.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				io.WriteString(w, "data: {\"n\":"+strconv.Itoa(i)+"}\n\n")
				w.(http.Flusher).Flush()
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	p := proxyWith(t, up.URL, nil)
	for _, c := range []struct {
		name, query, body string
		flushed           bool
	}{
		{"JSON", "", `{"ok":true}`, false},
		{"SSE", "?sse", "data: [DONE]\n\n", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := &flushCounter{ResponseRecorder: httptest.NewRecorder()}
			p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/chat/completions"+c.query, strings.NewReader(chatBody)))
			if w.Code != http.StatusOK || !strings.HasSuffix(w.Body.String(), c.body) {
				t.Fatalf("status %d body %q", w.Code, w.Body)
			}
			switch {
			case c.flushed && w.flushes == 0:
				t.Errorf("no flush, want the events flushed as they are relayed")
			case !c.flushed && (w.flushes != 1 || w.at[0] != len(c.body)):
				t.Errorf("flushes with %v bytes written, want one with all %d", w.at, len(c.body))
			}
		})
	}
}

// TestPooledBodiesStayIntact: request bodies are pooled (fewer allocations per request); under
// concurrent requests of many sizes, every replica receives exactly the
// body its client sent.
func TestPooledBodiesStayIntact(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(b) // echo
	}))
	defer up.Close()
	cfg := defaultProxyConfig()
	cfg.MaxBodyBytes = 4 << 20
	cfg.FirstByteTimeout = 10 * time.Minute // a slow -race run is no replica failure
	f := newFixture(t, cfg, replica{name: "a", url: up.URL}, replica{name: "b", url: up.URL})
	front := f.front(t)
	var wg sync.WaitGroup
	errs := make(chan string, 32)
	for i := range 32 {
		wg.Go(func() {
			pad := strings.Repeat(strconv.Itoa(i%10), (i*7919)%(128<<10))
			body := `{"model":"m","messages":[{"role":"user","content":"` + pad + `"}],"n":` + strconv.Itoa(i) + `}`
			code, got, err := postTo(front.URL, body)
			if err != nil || code != http.StatusOK || got != body {
				errs <- "request " + strconv.Itoa(i) + ": status " + strconv.Itoa(code) + ", echoed body differs: " + got[:min(len(got), 300)]
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}
