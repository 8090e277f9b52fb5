package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/testutil/policyspy"
)

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`

// recorder is a Recorder that remembers what it saw.
type recorder struct {
	mu        sync.Mutex
	requests  []string // "replica reason code"
	failovers []string
	streamErr []string
	firstByte int
}

func (r *recorder) Request(replica string, reason balancer.Reason, code int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.requests = append(r.requests, replica+" "+string(reason)+" "+http.StatusText(code))
}
func (r *recorder) FirstByte(string, time.Duration) { r.mu.Lock(); r.firstByte++; r.mu.Unlock() }
func (r *recorder) StreamError(rep string) {
	r.mu.Lock()
	r.streamErr = append(r.streamErr, rep)
	r.mu.Unlock()
}
func (r *recorder) Failover(rep string) {
	r.mu.Lock()
	r.failovers = append(r.failovers, rep)
	r.mu.Unlock()
}

// replica is one fake upstream for the fixture.
type replica struct {
	name string
	url  string // "" = a closed port (connection refused)
	key  string
}

type fixture struct {
	bal *balancer.Balancer
	p   *Proxy
	rec *recorder
}

func newFixture(t *testing.T, cfg Config, reps ...replica) *fixture {
	t.Helper()
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	keys := map[string]string{}
	for _, r := range reps {
		u := r.url
		if u == "" {
			u = closedURL(t)
		}
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: r.name, URL: u, Models: []string{"m"}}, time.Now()); err != nil {
			t.Fatal(err)
		}
		keys[r.name] = r.key
	}
	rec := &recorder{}
	p, err := New(Options{
		Balancer: bal,
		Request:  testRequestConfig,
		Proxy:    cfg,
		APIKey:   func(name string) string { return keys[name] },
		Metrics:  rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{bal: bal, p: p, rec: rec}
}

// closedURL is the URL of a port nobody listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

func (f *fixture) inFlight(t *testing.T) int {
	t.Helper()
	n := 0
	for _, r := range f.bal.Replicas(time.Now()) {
		n += r.InFlight
	}
	return n
}

func defaultProxyConfig() Config {
	return Config{MaxBodyBytes: 1 << 20, MaxAttempts: 3, RouteHeaders: true, PassAuthorization: true,
		ConnectTimeout: time.Second, FirstByteTimeout: 5 * time.Second}
}

func okUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Saw-Authorization", r.Header.Get("Authorization"))
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func post(t *testing.T, h http.Handler, body string, hdr map[string]string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body))
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func errorCode(t *testing.T, body []byte) string {
	t.Helper()
	var e openai.ErrorBody
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q is not an OpenAI error: %v", body, err)
	}
	return e.Error.Code
}

func TestBalancerErrors(t *testing.T) {
	up := okUpstream(t)
	tests := []struct {
		name     string
		reps     []replica
		body     string
		wantCode int
		wantErr  string
	}{
		{"malformed JSON is 400", []replica{{name: "a", url: up.URL}}, `{"model":`, 400, openai.CodeInvalidJSON},
		{"unknown model is 404", []replica{{name: "a", url: up.URL}}, `{"model":"nope","messages":[]}`, 404, openai.CodeModelNotFound},
		{"no replicas is 503", nil, chatBody, 503, openai.CodeNoHealthyInstances},
		{"all replicas refuse: 503 once every one was tried", []replica{{name: "a"}, {name: "b"}}, chatBody, 503, openai.CodeNoHealthyInstances},
		{"body over the limit is 413", []replica{{name: "a", url: up.URL}}, `{"model":"m","x":"` + strings.Repeat("x", 2000) + `"}`, 413, openai.CodeTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultProxyConfig()
			cfg.MaxBodyBytes = 1000
			f := newFixture(t, cfg, tt.reps...)
			w := post(t, f.p, tt.body, nil)
			if w.Code != tt.wantCode {
				t.Fatalf("status %d, want %d; body %s", w.Code, tt.wantCode, w.Body)
			}
			if got := errorCode(t, w.Body.Bytes()); got != tt.wantErr {
				t.Errorf("error code %q, want %q", got, tt.wantErr)
			}
			if n := f.inFlight(t); n != 0 {
				t.Errorf("in-flight %d after the request, want 0", n)
			}
		})
	}
}

// countingReader is an endless body that counts what was read of it.
type countingReader struct{ n int64 }

func (c *countingReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	c.n += int64(len(p))
	return len(p), nil
}

func TestTooLargeStopsReading(t *testing.T) {
	const limit = 64 << 10
	tests := []struct {
		name          string
		contentLength int64 // -1: chunked, unknown length
		maxRead       int64
	}{
		{"declared length over the limit: nothing read", 10 << 20, 0},
		{"chunked: reading stops at the limit", -1, limit + 32<<10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultProxyConfig()
			cfg.MaxBodyBytes = limit
			f := newFixture(t, cfg, replica{name: "a", url: okUpstream(t).URL})
			body := &countingReader{}
			r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", body)
			r.ContentLength = tt.contentLength
			w := httptest.NewRecorder()
			f.p.ServeHTTP(w, r)
			if w.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d, want 413", w.Code)
			}
			if body.n > tt.maxRead {
				t.Errorf("read %d bytes of the body, want at most %d", body.n, tt.maxRead)
			}
		})
	}
}

func TestFailoverOnRefusedConnection(t *testing.T) {
	up := okUpstream(t)
	f := newFixture(t, defaultProxyConfig(), replica{name: "dead"}, replica{name: "ok", url: up.URL})
	// Both replicas are idle, so round-robin sends some requests to "dead"
	// first; every one must still succeed on "ok".
	for i := range 4 {
		w := post(t, f.p, chatBody, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d, body %s", i, w.Code, w.Body)
		}
		if got := w.Header().Get(HeaderReplica); got != "ok" {
			t.Errorf("request %d: %s = %q, want ok", i, HeaderReplica, got)
		}
		if got := w.Header().Get(HeaderRoute); got == "" {
			t.Errorf("request %d: no %s header", i, HeaderRoute)
		}
	}
	if len(f.rec.failovers) == 0 {
		t.Error("no failover was counted although a replica refuses connections")
	}
	for _, r := range f.rec.failovers {
		if r != "dead" {
			t.Errorf("failover counted on %q, want dead", r)
		}
	}
	if n := f.inFlight(t); n != 0 {
		t.Errorf("in-flight %d, want 0", n)
	}
}

func TestAuthorization(t *testing.T) {
	tests := []struct {
		name   string
		key    string
		pass   bool
		client string
		want   string
	}{
		{"replica key replaces the client's", "sk-replica", true, "Bearer sk-client", "Bearer sk-replica"},
		{"client's passes without a key", "", true, "Bearer sk-client", "Bearer sk-client"},
		{"client's dropped when passing is off", "", false, "Bearer sk-client", ""},
		{"replica key set when the client sent none", "sk-replica", false, "", "Bearer sk-replica"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := defaultProxyConfig()
			cfg.PassAuthorization = tt.pass
			f := newFixture(t, cfg, replica{name: "a", url: okUpstream(t).URL, key: tt.key})
			hdr := map[string]string{}
			if tt.client != "" {
				hdr["Authorization"] = tt.client
			}
			w := post(t, f.p, chatBody, hdr)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if got := w.Header().Get("X-Saw-Authorization"); got != tt.want {
				t.Errorf("upstream saw Authorization %q, want %q", got, tt.want)
			}
		})
	}
}

func TestRouteHeadersOff(t *testing.T) {
	cfg := defaultProxyConfig()
	cfg.RouteHeaders = false
	f := newFixture(t, cfg, replica{name: "a", url: okUpstream(t).URL})
	w := post(t, f.p, chatBody, nil)
	if w.Header().Get(HeaderReplica) != "" || w.Header().Get(HeaderRoute) != "" {
		t.Errorf("route headers present although switched off: %v", w.Header())
	}
}

func TestServerErrorPassedThrough(t *testing.T) {
	calls := 0
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusInternalServerError)
		io.WriteString(w, `{"error":{"message":"boom"}}`)
	}))
	defer up.Close()
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
	w := post(t, f.p, chatBody, nil)
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), "boom") {
		t.Fatalf("got %d %q, want the replica's 500", w.Code, w.Body)
	}
	if calls != 1 {
		t.Errorf("replica called %d times, want 1 (a 5xx is an answer, not retried)", calls)
	}
	if w.Header().Get(HeaderReplica) != "a" {
		t.Errorf("missing %s on a 5xx answer", HeaderReplica)
	}
}

func TestFirstByteTimeoutIs504(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer up.Close()
	defer close(release)
	cfg := defaultProxyConfig()
	cfg.FirstByteTimeout = 50 * time.Millisecond
	f := newFixture(t, cfg, replica{name: "a", url: up.URL}, replica{name: "b", url: up.URL})
	w := post(t, f.p, chatBody, nil)
	if w.Code != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504; body %s", w.Code, w.Body)
	}
	if got := errorCode(t, w.Body.Bytes()); got != openai.CodeUpstreamTimeout {
		t.Errorf("code %q, want %q", got, openai.CodeUpstreamTimeout)
	}
	if len(f.rec.failovers) != 0 {
		t.Errorf("a first-byte timeout was retried on %v", f.rec.failovers)
	}
}

// sseUpstream sends two events and then breaks the connection.
func sseUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "data: {\"n\":1}\n\n")
		io.WriteString(w, "data: {\"n\":2}\n\ndata: {\"partial")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // cut the connection mid-stream
	}))
	t.Cleanup(s.Close)
	return s
}

func TestStreamBrokenMidwayEndsWithErrorEvent(t *testing.T) {
	up := sseUpstream(t)
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL}, replica{name: "b", url: up.URL})
	front := httptest.NewServer(f.p)
	defer front.Close()

	res, err := front.Client().Post(front.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("the stream should end cleanly with an error event, got %v after %q", err, body)
	}
	var events []string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, d)
		}
	}
	if len(events) < 3 || events[0] != `{"n":1}` || events[1] != `{"n":2}` {
		t.Fatalf("events %q: want the two relayed events first", events)
	}
	last := events[len(events)-1]
	if got := errorCode(t, []byte(last)); got != openai.CodeStreamBroken {
		t.Errorf("last event %q: code %q, want %q", last, got, openai.CodeStreamBroken)
	}
	if !strings.Contains(string(body), "{\"partial\n\n") {
		t.Errorf("the half-written event was not closed before the error event: %q", body)
	}
	f.rec.mu.Lock()
	defer f.rec.mu.Unlock()
	if len(f.rec.streamErr) != 1 || len(f.rec.failovers) != 0 {
		t.Errorf("stream errors %v, failovers %v: want one stream error and no retry", f.rec.streamErr, f.rec.failovers)
	}
}

func TestClientGoneMidStreamReleases(t *testing.T) {
	sent := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"n\":1}\n\n")
		http.NewResponseController(w).Flush()
		close(sent)
		<-r.Context().Done() // the replica learns that the client went away
	}))
	defer up.Close()
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
	handlerDone := make(chan struct{})
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		f.p.ServeHTTP(w, r)
	}))
	defer front.Close()

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[]}`))
	res, err := front.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-sent
	line, _ := bufio.NewReader(res.Body).ReadString('\n')
	if line != "data: {\"n\":1}\n" {
		t.Fatalf("first line %q", line)
	}
	if n := f.inFlight(t); n != 1 {
		t.Errorf("in-flight %d during the stream, want 1", n)
	}
	cancel()
	res.Body.Close()
	<-handlerDone
	if n := f.inFlight(t); n != 0 {
		t.Errorf("in-flight %d after the client went away, want 0", n)
	}
	if len(f.rec.streamErr) != 0 {
		t.Errorf("a client disconnect was counted as a stream error")
	}
}

func TestModels(t *testing.T) {
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: okUpstream(t).URL})
	w := httptest.NewRecorder()
	f.p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/models", nil))
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	if list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "m" || list.Data[0].Object != "model" {
		t.Errorf("models %+v", list)
	}
}

func TestPassThroughUnknownPath(t *testing.T) {
	var path string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		io.WriteString(w, "{}")
	}))
	defer up.Close()
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
	w := httptest.NewRecorder()
	f.p.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/v1/audio/transcriptions", strings.NewReader("not json")))
	if w.Code != http.StatusOK || path != "/v1/audio/transcriptions" {
		t.Errorf("status %d, upstream path %q", w.Code, path)
	}
	w = httptest.NewRecorder()
	f.p.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/other", nil))
	if w.Code != http.StatusNotFound {
		t.Errorf("non-/v1 path: status %d, want 404", w.Code)
	}
}

var testRequestConfig = request.Config{SessionHeaders: []string{"x-session-id"}, PrefixChars: 4096, DefaultOutputTokens: 256}

func TestClientGoneBeforeAnswerIsCounted499(t *testing.T) {
	arrived := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // then net/http watches the connection
		close(arrived)
		<-r.Context().Done()
	}))
	defer up.Close()
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL}, replica{name: "b", url: up.URL})
	ctx, cancel := context.WithCancel(context.Background())
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(chatBody)).WithContext(ctx)
	w := httptest.NewRecorder()
	go func() {
		<-arrived
		cancel()
	}()
	f.p.ServeHTTP(w, r)
	if len(f.rec.requests) != 1 || !strings.HasSuffix(f.rec.requests[0], " ") {
		// StatusText(499) is "": the entry ends with the separator.
		t.Errorf("requests %q, want one client-closed entry", f.rec.requests)
	}
	if len(f.rec.failovers) != 0 {
		t.Errorf("a client that went away was retried on %v", f.rec.failovers)
	}
	if n := f.inFlight(t); n != 0 {
		t.Errorf("in-flight %d, want 0", n)
	}
}

// TestRejectedAnswerIsNotIndexed: a replica's 4xx (a prompt over its
// context, a bad parameter) served nothing, so a policy that indexes the
// prompts replicas finished is not told of it; the replica stays healthy.
func TestRejectedAnswerIsNotIndexed(t *testing.T) {
	long := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("tell me more about blocks ", 40) + `"}]}`
	for _, tc := range []struct {
		status       int
		wantFinished int
	}{{http.StatusOK, 1}, {http.StatusBadRequest, 0}} {
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.WriteHeader(tc.status)
			io.WriteString(w, `{}`)
		}))
		spy := &policyspy.Finishes{}
		bal, err := balancer.NewWithPolicy(balancer.DefaultConfig(), spy)
		if err != nil {
			t.Fatal(err)
		}
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: up.URL, Models: []string{"m"}}, time.Now()); err != nil {
			t.Fatal(err)
		}
		rc := testRequestConfig
		rc.PromptBlocks = true // as serve sets it for policy cost
		p, err := New(Options{Balancer: bal, Request: rc, Proxy: defaultProxyConfig(), Metrics: &recorder{}})
		if err != nil {
			t.Fatal(err)
		}
		if w := post(t, p, long, nil); w.Code != tc.status {
			t.Fatalf("got %d, want the replica's %d", w.Code, tc.status)
		}
		up.Close()
		if got := len(spy.Calls()); got != tc.wantFinished {
			t.Errorf("status %d: policy told of %d finished prompts, want %d", tc.status, got, tc.wantFinished)
		}
		if st := bal.Replicas(time.Now())[0].State; st != health.Live.String() {
			t.Errorf("status %d: replica %s, want LIVE", tc.status, st)
		}
	}
}

// TestLargeHeadersAndBodiesPassTheSmallBuffers: the connections to the
// replicas have small buffers (NewTransport); header lines and bodies many
// times their size pass whole, both ways.
func TestLargeHeadersAndBodiesPassTheSmallBuffers(t *testing.T) {
	longHeader := strings.Repeat("h", 12<<10)
	answer := strings.Repeat("a", 300<<10)
	var got string
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
		if r.Header.Get("X-Long") != longHeader {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("X-Long-Answer", longHeader)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"answer":"`+answer+`"}`)
	}))
	defer up.Close()
	f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("q", 200<<10) + `"}]}`
	w := post(t, f.p, body, map[string]string{"X-Long": longHeader})
	if w.Code != http.StatusOK || w.Header().Get("X-Long-Answer") != longHeader || w.Body.String() != `{"answer":"`+answer+`"}` {
		t.Fatalf("got %d, answer header %d bytes, body %d bytes", w.Code, len(w.Header().Get("X-Long-Answer")), w.Body.Len())
	}
	if got != body {
		t.Fatalf("the replica read %d bytes of a %d-byte body", len(got), len(body))
	}
}
