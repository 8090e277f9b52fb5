//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Secrets the abuse test plants; none may appear in any log line.
const (
	replicaKey  = "sk-replica-key-e2e-7Hq2"
	adminToken  = "admin-token-e2e-Zp81"
	clientKey   = "sk-client-key-e2e-Xw93"
	wrongAdmin  = "wrong-admin-token-e2e-Lk55"
	injectedHdr = "X-Injected-E2e"
)

// fakeReplica is a minimal vLLM stand-in in the test process that records
// the headers of the proxied requests it receives.
type fakeReplica struct {
	srv     *httptest.Server
	mu      sync.Mutex
	headers []http.Header
}

func newFakeReplica(t *testing.T) *fakeReplica {
	f := &fakeReplica{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_running{engine=\"0\",model_name=\"sim-model\"} 0\n"+
			"vllm:num_requests_waiting{engine=\"0\",model_name=\"sim-model\"} 0\n"+
			"vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"sim-model\"} 0\n")
	})
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.headers = append(f.headers, r.Header.Clone())
		f.mu.Unlock()
		body, _ := io.ReadAll(r.Body)
		if bytes.Contains(body, []byte("slowstream")) { // 2 s of SSE: longer than read_body_timeout
			w.Header().Set("Content-Type", "text/event-stream")
			for range 20 {
				io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}`+"\n\n")
				http.NewResponseController(w).Flush()
				time.Sleep(100 * time.Millisecond)
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"chat.completion","model":"sim-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeReplica) seen() []http.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]http.Header(nil), f.headers...)
}

// TestAbuse is the bad-input guarantee: slow clients, oversized bodies, deep
// JSON, invalid UTF-8, wrong content types, CR/LF in session keys and
// unauthenticated admin mutations each get a clear error (never a panic,
// never a 5xx from the balancer itself), and no secret (replica api_key,
// admin token, client Authorization) appears in any log line at debug level.
func TestAbuse(t *testing.T) {
	fake := newFakeReplica(t)
	srv := startServe(t, fmt.Sprintf(`replicas:
  - name: fake
    url: %s
    models: [sim-model]
    api_key_env: LLMLB_E2E_REPLICA_KEY
admin_token_env: LLMLB_E2E_ADMIN_TOKEN
log:
  level: debug
server:
  read_header_timeout: 500ms
  read_body_timeout: 1s
proxy:
  max_body_bytes: 1MiB
scrape:
  interval: 1s
  timeout: 1s
`, fake.srv.URL), "LLMLB_E2E_REPLICA_KEY="+replicaKey, "LLMLB_E2E_ADMIN_TOKEN="+adminToken)
	waitFor(t, 10*time.Second, "fake replica LIVE", func() (bool, string) {
		return status(srv.admin+"/readyz") == http.StatusOK, "not ready"
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	post := func(t *testing.T, body []byte, header map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.proxy+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+clientKey)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatalf("POST: %v", err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	openAIError := func(t *testing.T, body string) {
		t.Helper()
		var e struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
			t.Errorf("not an OpenAI error shape: %.300s", body)
		}
	}
	good := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`

	t.Run("valid request replaces Authorization with the replica key", func(t *testing.T) {
		code, body := post(t, []byte(good), nil)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		hs := fake.seen()
		if got := hs[len(hs)-1].Get("Authorization"); got != "Bearer "+replicaKey {
			t.Errorf("upstream Authorization %q, want the replica's api key", got)
		}
	})

	t.Run("a stream longer than read_body_timeout is not cut", func(t *testing.T) {
		r := srv.chat(ctx, chatReq{User: "slowstream", Stream: true, Header: http.Header{"Authorization": {"Bearer " + clientKey}}})
		if !r.ok() {
			t.Errorf("2 s stream with read_body_timeout 1s: %+v", r)
		}
	})

	t.Run("slow headers are cut by read_header_timeout", func(t *testing.T) {
		c, err := net.Dial("tcp", srv.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n") // and never the rest
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(15 * time.Second))
		_, err = io.ReadAll(c) // the server closes (possibly after a 408)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("connection with unfinished headers still open after 15 s")
		}
		t.Logf("slow-header connection closed after %v (read_header_timeout 500ms)", time.Since(start).Round(time.Millisecond))
	})

	t.Run("slow body gets 408 after read_body_timeout", func(t *testing.T) {
		c, err := net.Dial("tcp", srv.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\":")
		start := time.Now()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("a body trickling in holds the connection beyond 20 s")
		}
		if err == nil {
			res.Body.Close()
			if res.StatusCode != http.StatusRequestTimeout {
				t.Errorf("slow body answered %d, want 408", res.StatusCode)
			}
			t.Logf("slow body: %d after %v", res.StatusCode, time.Since(start).Round(time.Millisecond))
		} else {
			t.Logf("slow body: connection closed after %v (%v)", time.Since(start).Round(time.Millisecond), err)
		}
	})

	t.Run("body over the limit is 413", func(t *testing.T) {
		big := `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("a", 2<<20) + `"}]}`
		code, body := post(t, []byte(big), nil)
		if code != http.StatusRequestEntityTooLarge {
			t.Errorf("status %d, want 413", code)
		}
		openAIError(t, body)
		// Chunked (no Content-Length): the limit still holds.
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.proxy+"/v1/chat/completions", io.MultiReader(strings.NewReader(big)))
		req.ContentLength = -1
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("chunked: status %d, want 413", res.StatusCode)
		}
	})

	t.Run("deeply nested JSON is 400", func(t *testing.T) {
		for _, depth := range []int{10_000, 200_000} {
			deep := `{"model":"sim-model","messages":` + strings.Repeat("[", depth) + strings.Repeat("]", depth) + `}`
			code, body := post(t, []byte(deep), nil)
			if code != http.StatusBadRequest {
				t.Errorf("depth %d: status %d, want 400", depth, code)
			}
			openAIError(t, body)
			deepObj := `{"model":"sim-model","metadata":` + strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth) + `,"messages":[]}`
			if code, _ := post(t, []byte(deepObj), nil); code >= 500 {
				t.Errorf("nested metadata depth %d: status %d", depth, code)
			}
		}
	})

	t.Run("invalid UTF-8 gets a clear answer", func(t *testing.T) {
		bad := []byte(`{"model":"sim-model","messages":[{"role":"user","content":"` + "\xff\xfe\xc3\x28" + `"}]}`)
		code, body := post(t, bad, nil)
		if code != http.StatusOK && code != http.StatusBadRequest {
			t.Errorf("status %d: %s", code, body)
		}
		if code == http.StatusBadRequest {
			openAIError(t, body)
		}
		badModel := []byte(`{"model":"` + "sim\xff" + `","messages":[{"role":"user","content":"x"}]}`)
		if code, body := post(t, badModel, nil); code != http.StatusNotFound && code != http.StatusBadRequest {
			t.Errorf("invalid UTF-8 model: status %d: %s", code, body)
		}
	})

	t.Run("wrong content types", func(t *testing.T) {
		for _, c := range []struct{ ctype, body string }{
			{"text/plain", "this is not json"},
			{"application/x-www-form-urlencoded", "model=sim-model&messages=x"},
			{"multipart/form-data; boundary=x", "--x\r\nContent-Disposition: form-data; name=model\r\n\r\nsim-model\r\n--x--\r\n"},
		} {
			code, body := post(t, []byte(c.body), map[string]string{"Content-Type": c.ctype})
			if code != http.StatusBadRequest && code != http.StatusUnsupportedMediaType {
				t.Errorf("%s: status %d, want 400 or 415", c.ctype, code)
			}
			openAIError(t, body)
		}
	})

	t.Run("CR/LF in session keys never reaches headers or logs", func(t *testing.T) {
		n := len(fake.seen())
		evil := "sess\r\n" + injectedHdr + ": 1\r\n\r\nGET / HTTP/1.1"
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt_cache_key": evil,
			"metadata": map[string]string{"session_id": evil},
			"messages": []map[string]string{{"role": "user", "content": "x"}}})
		if code, body := post(t, b, nil); code != http.StatusOK && code != http.StatusBadRequest {
			t.Errorf("status %d: %s", code, body)
		}
		// Raw CR inside a header value: the HTTP parser must reject it.
		c, err := net.Dial("tcp", srv.proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-Id: a\rb\r\nContent-Length: %d\r\n\r\n%s", len(good), good)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			res.Body.Close()
			if res.StatusCode != http.StatusBadRequest {
				t.Errorf("bare CR in X-Session-Id: status %d, want 400", res.StatusCode)
			}
		}
		for _, h := range fake.seen()[n:] {
			if h.Get(injectedHdr) != "" {
				t.Errorf("injected header reached the replica: %v", h)
			}
		}
	})

	t.Run("admin mutations need the token", func(t *testing.T) {
		for _, m := range []struct{ method, path, body string }{
			{"POST", "/admin/replicas", `{"name":"evil","url":"http://127.0.0.1:1"}`},
			{"DELETE", "/admin/replicas/fake", ""},
			{"POST", "/admin/replicas/fake/drain", ""},
			{"POST", "/admin/replicas/fake/undrain", ""},
		} {
			for _, auth := range []string{"", "Bearer " + wrongAdmin, "Basic " + adminToken, "Bearer " + adminToken + "x"} {
				req, _ := http.NewRequestWithContext(ctx, m.method, srv.admin+m.path, strings.NewReader(m.body))
				if auth != "" {
					req.Header.Set("Authorization", auth)
				}
				res, err := httpClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusUnauthorized {
					t.Errorf("%s %s with %q: status %d, want 401", m.method, m.path, auth, res.StatusCode)
				}
				openAIError(t, string(b))
			}
		}
		if _, ok := srv.replicas(t)["evil"]; ok {
			t.Errorf("an unauthenticated POST added a replica")
		}
		if r := srv.replicas(t)["fake"]; r.Name == "" || r.Draining {
			t.Errorf("an unauthenticated mutation changed the fake replica: %+v", r)
		}
		// With the token the same mutation works.
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.admin+"/admin/replicas/fake/undrain", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("undrain with the token: %d", res.StatusCode)
		}
	})

	// The process is alive and never panicked; no secret in any log line.
	if srv.p.exited() {
		t.Fatalf("llmlb serve died during the abuse test")
	}
	if status(srv.admin+"/healthz") != http.StatusOK {
		t.Errorf("healthz not 200 after the abuse")
	}
	out := srv.p.out.String()
	if strings.Contains(out, "panic") || strings.Contains(out, "goroutine ") {
		t.Errorf("serve output shows a panic")
	}
	for _, secret := range []string{replicaKey, adminToken, clientKey, wrongAdmin} {
		if strings.Contains(out, secret) {
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, secret) {
					t.Errorf("secret %q in a log line: %.300s", secret[:8]+"...", line)
					break
				}
			}
		}
	}
	if strings.Contains(out, "\r\n"+injectedHdr) || strings.Contains(out, "\n"+injectedHdr) {
		t.Errorf("a CR/LF from a session key reached the log raw")
	}
	lines := strings.Count(out, "\n")
	if !strings.Contains(out, "level=DEBUG") {
		t.Errorf("no debug line logged: the secret check would prove little (%d lines)", lines)
	}
	t.Logf("GUARANTEE abuse: serve alive, %d log lines at debug checked, no secret and no raw CR/LF in them", lines)
}
