package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
)

// TestSlowBodyGets408: a client that sends headers and then trickles (or
// stops sending) its body gets 408 in OpenAI's shape once ReadBodyTimeout
// passes, and the connection is closed, instead of holding a handler
// forever (http.Server has no ReadTimeout: it would cut long streams).
func TestSlowBodyGets408(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: okUpstream(t).URL, Models: []string{"m"}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Balancer: bal, Request: testRequestConfig, ReadBodyTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	defer srv.Close()

	for _, tc := range []struct {
		name    string
		partial string // body bytes sent of a declared 1000
	}{
		{"no body byte", ""},
		{"part of the body", `{"model":"m","messages":[`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n%s", tc.partial)
			c.SetReadDeadline(time.Now().Add(30 * time.Second)) // bounds a hang; not the figure under test
			res, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer to a stalled body: %v", err)
			}
			defer res.Body.Close()
			var e openai.ErrorBody
			if err := json.NewDecoder(res.Body).Decode(&e); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusRequestTimeout || e.Error.Code != openai.CodeBodyTimeout || !res.Close {
				t.Errorf("status %d code %q close %v, want 408 %q and Connection: close", res.StatusCode, e.Error.Code, res.Close, openai.CodeBodyTimeout)
			}
		})
	}

	// A complete body in time is served normally.
	res, err := srv.Client().Post(srv.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("complete body: status %d", res.StatusCode)
	}
}
