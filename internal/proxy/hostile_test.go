package proxy

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/testutil/hostile"
)

// Regression tests of docs/SECURITY.md's "Proxy port and upstreams" on the
// proxy port (hostile clients and upstreams). Each names its attack; each failed on the code before the fix.

const streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`

// front serves the fixture's proxy on a loopback listener.
func (f *fixture) front(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(f.p)
	t.Cleanup(s.Close)
	return s
}

// postTo sends body to url+path and returns the status, the whole body and
// the error that ended the request or reading it (status 0: no answer).
// ctx bounds a hang of the code under test; it is not the figure under
// test. It may run on any goroutine.
func postTo(url, body string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}

// ejectByScrape ejects a replica the way a failed scrape does and tells
// the proxy, as the server's transition hook does.
func (f *fixture) ejectByScrape(name string) {
	for _, tr := range f.bal.ObserveScrape(name, balancer.Snapshot{}, errors.New("connection refused"), time.Now()) {
		if tr.To.String() == "EJECTED" {
			f.p.Ejected(tr.Replica)
		}
	}
}

func (f *fixture) state(name string) balancer.ReplicaStatus {
	for _, r := range f.bal.Replicas(time.Now()) {
		if r.Name == name {
			return r
		}
	}
	return balancer.ReplicaStatus{}
}

// stallingBody is a request body that sends its first bytes and then
// fails as a read deadline does.
type stallingBody struct{ first []byte }

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func (s *stallingBody) Read(p []byte) (int, error) {
	if len(s.first) > 0 {
		n := copy(p, s.first)
		s.first = s.first[n:]
		return n, nil
	}
	return 0, timeoutErr{}
}

// TestAnnouncedBodyIsNotPreallocated ("Memory before the body arrives"): a client that announces a
// 32 MB body and sends one byte gets its 408 without the proxy allocating
// anything near 32 MB: the buffer grows only as bytes arrive.
func TestAnnouncedBodyIsNotPreallocated(t *testing.T) {
	cfg := defaultProxyConfig()
	cfg.MaxBodyBytes = 64 << 20
	f := newFixture(t, cfg, replica{name: "a", url: okUpstream(t).URL})
	const clients = 10
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range clients {
		r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", &stallingBody{first: []byte("{")})
		r.ContentLength = 32 << 20
		w := httptest.NewRecorder()
		f.p.ServeHTTP(w, r)
		if w.Code != http.StatusRequestTimeout {
			t.Fatalf("status %d, want 408", w.Code)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Fatalf("%d clients announcing 32 MiB and sending 1 byte allocated %d MiB, want < 4 MiB", clients, got>>20)
	}
}

// TestReadGrowing: the body reader returns exactly what arrived, whatever
// was announced, and never holds more than twice what arrived.
func TestReadGrowing(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      int
		announced int64
	}{
		{"exact length", 100_000, 100_000},
		{"small, exact length", 150, 150},
		{"small, announced short", 150, 100},
		{"unknown length (chunked)", 100_000, -1},
		{"empty", 0, 0},
		{"announced far more than sent", 10, 32 << 20},
		{"absurd announcement", 10, 1<<63 - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Repeat("x", tc.body)
			got, err := readGrowing(strings.NewReader(src), tc.announced)
			if err != nil || string(got) != src {
				t.Fatalf("read %d bytes, err %v; want %d", len(got), err, tc.body)
			}
			if cap(got) > max(2*tc.body, 16<<10)+1 {
				t.Fatalf("capacity %d for %d bytes", cap(got), tc.body)
			}
			if tc.announced == int64(tc.body) && tc.body < minPooledBody && cap(got) != tc.body+1 {
				t.Fatalf("capacity %d for a small body of %d bytes, want its length + 1", cap(got), tc.body)
			}
		})
	}
}

// TestPathTraversalIsRefused ("Path traversal"): dot segments, plain or
// percent-encoded, never reach a replica (whose /metrics or /health they
// would hit); they get 400 invalid_path.
func TestPathTraversalIsRefused(t *testing.T) {
	up := hostile.NewUpstream(t, map[string]hostile.Behavior{
		"/metrics": hostile.Metrics(), "/health": hostile.JSON(200, `{}`),
		"/v1/chat/completions": hostile.JSON(200, `{"ok":true}`),
	})
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
	addr := f.front(t).Listener.Addr().String()
	for _, target := range []string{
		"/v1/../metrics",
		"/v1/%2e%2e/health",
		"/v1/%2E%2E/metrics",
		"/v1/..%2fmetrics",
		"/v1/./../health",
		"/v1/chat/../../metrics",
		"/v1/models/../../metrics",
	} {
		t.Run(target, func(t *testing.T) {
			method := http.MethodPost
			if strings.HasPrefix(target, "/v1/models") {
				method = http.MethodGet
			}
			code, body := hostile.Raw(t, addr, method, target, chatBody)
			if code != http.StatusBadRequest || errorCode(t, []byte(body)) != openai.CodeInvalidPath {
				t.Fatalf("status %d %s, want 400 %s", code, body, openai.CodeInvalidPath)
			}
		})
	}
	if n := up.Hits("/metrics") + up.Hits("/health"); n != 0 {
		t.Fatalf("%d requests reached the replica's /metrics or /health", n)
	}
	if code, body := hostile.Raw(t, addr, http.MethodPost, "/v1/chat/completions", chatBody); code != http.StatusOK {
		t.Fatalf("a clean path: status %d %s", code, body)
	}
}

// TestWebSocketUpgrade ("WebSocket upgrade"): a WebSocket (vLLM's /v1/realtime) is
// proxied with a real round trip, and upgrades are never counted as
// replica failures: after several, the replica is LIVE, never ejected.
func TestWebSocketUpgrade(t *testing.T) {
	up := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/realtime": hostile.WebSocketEcho()})
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
	ws := "ws" + strings.TrimPrefix(f.front(t).URL, "http") + "/v1/realtime"
	for i := range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		c, res, err := websocket.Dial(ctx, ws, nil)
		if err != nil {
			cancel()
			t.Fatalf("upgrade %d: %v", i, err)
		}
		if res.Header.Get(HeaderReplica) != "a" {
			t.Errorf("upgrade %d: %s %q", i, HeaderReplica, res.Header.Get(HeaderReplica))
		}
		for _, msg := range []string{"hello", "world"} {
			if err := c.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
				t.Fatalf("upgrade %d: write: %v", i, err)
			}
			_, got, err := c.Read(ctx)
			if err != nil || string(got) != msg {
				t.Fatalf("upgrade %d: echo %q, %v; want %q", i, got, err, msg)
			}
		}
		c.Close(websocket.StatusNormalClosure, "")
		cancel()
	}
	waitFor(t, "the upgrades released", func() bool { return f.inFlight(t) == 0 })
	if st := f.state("a"); st.State != "LIVE" || st.Ejections != 0 {
		t.Fatalf("after 5 upgrades the replica is %s with %d ejections", st.State, st.Ejections)
	}
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	if len(f.rec.failovers) != 0 || len(f.rec.streamErr) != 0 {
		t.Fatalf("failovers %v, stream errors %v: an upgrade is no failure", f.rec.failovers, f.rec.streamErr)
	}
}

// waitFor polls cond until it holds (a generous deadline, not a figure).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHungStreamEndsWithErrorEvent ("Hung replica"): a stream whose replica stops
// sending ends, after proxy.stream_idle_timeout, with the SSE error event,
// counted as a stream error. Silence inside a started stream is not a
// health signal (an overloaded replica's queue looks the same; a hung one
// fails its scrapes): three such streams leave the replica LIVE.
func TestHungStreamEndsWithErrorEvent(t *testing.T) {
	up := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.HangAfterHeaders(2)})
	cfg := defaultProxyConfig()
	cfg.StreamIdleTimeout = 100 * time.Millisecond
	f := newFixture(t, cfg, replica{name: "a", url: up.URL})
	url := f.front(t).URL
	for i := range 3 {
		code, body, err := postTo(url, streamBody)
		if err != nil || code != http.StatusOK {
			t.Fatalf("stream %d: status %d, read error %v after %q", i, code, err, body)
		}
		if !strings.HasPrefix(body, hostile.Events(2, false)) || !strings.Contains(body, openai.CodeStreamBroken) || !strings.Contains(body, "sent nothing for") {
			t.Fatalf("stream %d: body %q: want the 2 events, then the error event", i, body)
		}
	}
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	if len(f.rec.streamErr) != 3 {
		t.Fatalf("stream errors %v, want 3", f.rec.streamErr)
	}
	if st := f.state("a"); st.State != "LIVE" {
		t.Fatalf("the replica is %s after 3 silent streams, want LIVE", st.State)
	}
}

// TestEjectedWhileWaitingFailsOver ("Hung replica"): a request waiting for the
// answer of a replica that gets EJECTED (by its scrape) fails over at once,
// since nothing reached its client yet; first_byte_timeout is not awaited.
func TestEjectedWhileWaitingFailsOver(t *testing.T) {
	hung := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.Hang()})
	ok := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.JSON(200, `{"ok":true}`)})
	cfg := defaultProxyConfig()
	cfg.FirstByteTimeout = time.Hour
	f := newFixture(t, cfg, replica{name: "hung", url: hung.URL}, replica{name: "ok", url: ok.URL})
	f.bal.SetDraining("ok", true) // the first attempt goes to the hung replica
	url := f.front(t).URL
	type result struct {
		code int
		body string
	}
	done := make(chan result, 1)
	go func() {
		code, body, _ := postTo(url, chatBody)
		done <- result{code, body}
	}()
	waitFor(t, "the request to reach the hung replica", func() bool { return hung.Hits("/v1/chat/completions") == 1 })
	f.bal.SetDraining("ok", false)
	f.ejectByScrape("hung")
	r := <-done
	if r.code != http.StatusOK || !strings.Contains(r.body, `"ok":true`) {
		t.Fatalf("status %d %s, want 200 from the other replica", r.code, r.body)
	}
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	if len(f.rec.failovers) != 1 || f.rec.failovers[0] != "hung" {
		t.Fatalf("failovers %v, want [hung]", f.rec.failovers)
	}
}

// TestEjectionCancelsOnlyItsReplica: the waiting attempts of all replicas
// share one set, so an ejection must cancel the attempts waiting on that
// replica (with errReplicaEjected) and leave the others waiting.
func TestEjectionCancelsOnlyItsReplica(t *testing.T) {
	s := waitingSet{m: make(map[*attempt]struct{})}
	newAttempt := func(replica string) *attempt {
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		a := &attempt{res: &balancer.Reservation{Replica: replica}, ctx: ctx, cancel: cancel}
		s.add(a)
		return a
	}
	a1, a2, b := newAttempt("a"), newAttempt("a"), newAttempt("b")
	s.cancel("a", errReplicaEjected)
	for _, a := range []*attempt{a1, a2} {
		if !errors.Is(context.Cause(a.ctx), errReplicaEjected) {
			t.Fatalf("attempt on the ejected replica: cause %v, want errReplicaEjected", context.Cause(a.ctx))
		}
	}
	if b.ctx.Err() != nil {
		t.Fatalf("attempt on replica b cancelled by a's ejection: %v", context.Cause(b.ctx))
	}
	if _, ok := s.m[b]; !ok || len(s.m) != 1 {
		t.Fatalf("waiting set after the ejection has %d attempts, want only b's", len(s.m))
	}
	s.remove(b)
	if len(s.m) != 0 {
		t.Fatalf("waiting set not empty after remove: %d", len(s.m))
	}
}

// TestAllDeadIs503AtOnce ("All replicas dead"): every replica EJECTED by failed
// scrapes (refused, hung): the answer is 503 no_healthy_instances and no
// request is sent to them (the old fallback sent it to a hung one and the
// client waited for first_byte_timeout).
func TestAllDeadIs503AtOnce(t *testing.T) {
	hung := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.Hang()})
	cfg := defaultProxyConfig()
	cfg.FirstByteTimeout = 2 * time.Second // the old code's answer: 504 after it
	f := newFixture(t, cfg, replica{name: "a", url: hung.URL}, replica{name: "b", url: hung.URL})
	f.ejectByScrape("a")
	f.ejectByScrape("b")
	w := post(t, f.p, chatBody, nil)
	if w.Code != http.StatusServiceUnavailable || errorCode(t, w.Body.Bytes()) != openai.CodeNoHealthyInstances {
		t.Fatalf("status %d %s, want 503 %s", w.Code, w.Body, openai.CodeNoHealthyInstances)
	}
	if n := hung.Hits("/v1/chat/completions"); n != 0 {
		t.Fatalf("%d attempts sent to dead replicas", n)
	}
}

// TestLiveButDeadIsEjected ("LIVE but dead"): a replica whose /metrics answers but
// whose API hangs is LIVE by its scrapes; the balancer's own time-outs of
// its streaming requests count as its failures, so it is ejected after
// routing.health.request_failures_to_eject of them, and each of those
// requests was served by another replica meanwhile.
func TestLiveButDeadIsEjected(t *testing.T) {
	dead := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.Hang(), "/metrics": hostile.Metrics()})
	ok := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.SSE(2, true)})
	cfg := defaultProxyConfig()
	cfg.FirstByteTimeout = time.Hour // clients give up long before
	cfg.StreamIdleTimeout = 100 * time.Millisecond
	f := newFixture(t, cfg, replica{name: "dead", url: dead.URL}, replica{name: "ok", url: ok.URL})
	url := f.front(t).URL
	for i := range 8 {
		code, body, err := postTo(url, streamBody)
		if err != nil || code != http.StatusOK || !strings.HasSuffix(body, "data: [DONE]\n\n") {
			t.Fatalf("request %d: status %d, error %v, body %q", i, code, err, body)
		}
	}
	if st := f.state("dead"); st.State != "EJECTED" {
		t.Fatalf("the hung replica is %s after %d timed-out requests, want EJECTED", st.State, dead.Hits("/v1/chat/completions"))
	}
}

// TestCutResponsesAreErrors ("Truncated answers"): a response that ends before its
// protocol says it is complete reaches the client as an error and is
// counted as a stream error: an SSE stream of chat completions without
// "data: [DONE]" even when the HTTP framing (close-delimited) looks clean,
// a chunked stream cut before its last chunk, a body shorter than its
// Content-Length. Complete answers are not.
func TestCutResponsesAreErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		upstream   hostile.Behavior
		wantBroken bool // counted as a stream error
		wantEvent  bool // the client sees the SSE error event
		wantCut    bool // the client sees its read fail (no SSE to speak)
	}{
		{"close-delimited SSE without [DONE]", hostile.CloseDelimitedSSE(2, false), true, true, false},
		{"close-delimited SSE with [DONE]", hostile.CloseDelimitedSSE(2, true), false, false, false},
		{"chunked SSE cut before the last chunk", hostile.CutChunked(2), true, true, false},
		{"chunked SSE ended cleanly without [DONE]", hostile.SSE(2, false), true, true, false},
		{"chunked SSE complete", hostile.SSE(2, true), false, false, false},
		{"JSON shorter than its Content-Length", hostile.ShortBody(), true, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": tc.upstream})
			f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
			code, body, err := postTo(f.front(t).URL, streamBody)
			if code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			if gotEvent := strings.Contains(body, openai.CodeStreamBroken); gotEvent != tc.wantEvent {
				t.Errorf("error event %v, want %v; body %q", gotEvent, tc.wantEvent, body)
			}
			if (err != nil) != tc.wantCut {
				t.Errorf("client read error %v, want one: %v", err, tc.wantCut)
			}
			f.rec.mu.Lock()
			broken := len(f.rec.streamErr)
			f.rec.mu.Unlock()
			if (broken == 1) != tc.wantBroken || broken > 1 {
				t.Errorf("stream errors %d, want broken=%v", broken, tc.wantBroken)
			}
		})
	}
}

// TestSlowDripIsNotCut ("Hung replica", the other side): a stream that keeps
// sending, each gap shorter than proxy.stream_idle_timeout, is relayed to
// its end however long it lasts in all.
func TestSlowDripIsNotCut(t *testing.T) {
	// 30 events 50 ms apart: 1.5 s in all, longer than the 1 s idle
	// timeout, each gap 20x shorter than it.
	up := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.Drip(30, 50*time.Millisecond)})
	cfg := defaultProxyConfig()
	cfg.StreamIdleTimeout = time.Second
	f := newFixture(t, cfg, replica{name: "a", url: up.URL})
	code, body, err := postTo(f.front(t).URL, streamBody)
	if err != nil || code != http.StatusOK || body != hostile.Events(30, true) {
		t.Fatalf("status %d, error %v, body %q", code, err, body)
	}
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	if len(f.rec.streamErr) != 0 || len(f.rec.failovers) != 0 {
		t.Fatalf("stream errors %v, failovers %v", f.rec.streamErr, f.rec.failovers)
	}
}

// TestFirstByteTimeoutsEject ("LIVE but dead", non-streaming requests): each expiry
// of proxy.first_byte_timeout answers 504 and is the replica's failure, so
// request_failures_to_eject (3) of them eject a replica whose API hangs.
func TestFirstByteTimeoutsEject(t *testing.T) {
	dead := hostile.NewUpstream(t, map[string]hostile.Behavior{"/v1/chat/completions": hostile.Hang()})
	cfg := defaultProxyConfig()
	cfg.FirstByteTimeout = 50 * time.Millisecond
	f := newFixture(t, cfg, replica{name: "dead", url: dead.URL})
	for i := range 3 {
		if w := post(t, f.p, chatBody, nil); w.Code != http.StatusGatewayTimeout {
			t.Fatalf("request %d: status %d, want 504", i, w.Code)
		}
	}
	if st := f.state("dead"); st.State != "EJECTED" {
		t.Fatalf("after 3 first-byte timeouts the replica is %s, want EJECTED", st.State)
	}
}
