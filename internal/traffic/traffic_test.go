package traffic

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestReadStream(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr bool
	}{
		{"complete", "data: {\"x\":1}\n\ndata: [DONE]\n\n", false},
		{"no done", "data: {\"x\":1}\n\n", true},
		{"error event", "data: {\"x\":1}\n\ndata: {\"error\":{\"message\":\"boom\"}}\n\n", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readStream(strings.NewReader(tt.body), time.Now())
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

// A fake balancer that streams two chunks; the generator must send sessions
// and bursts and count every request as ok.
func TestGeneratorAgainstFakeUpstream(t *testing.T) {
	// Counted in one step each: a handler still running when the test
	// reads (its client gone at cancel) cannot be half counted.
	var calls, withoutSession atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.Header.Get("X-Session-Id") == "" {
			withoutSession.Add(1)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-LLMLB-Replica", "r1")
		w.Header().Set("X-LLMLB-Route", "load")
		fmt.Fprint(w, "data: {\"choices\":[]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	g := New(Options{BaseURL: srv.URL, Model: "m", Users: 3, BurstMin: 2, BurstMax: 4, Turns: 2, SystemPromptChars: 100})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { g.Run(ctx); close(done) }()
	deadline := time.After(10 * time.Second)
	for g.Stats().Snapshot().Requests < 30 {
		select {
		case <-deadline:
			t.Fatalf("only %d requests in 10s", g.Stats().Snapshot().Requests)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	<-done
	s := g.Stats().Snapshot()
	if s.Failed != 0 || s.OK != s.Requests {
		t.Fatalf("summary %+v: want every request ok", s)
	}
	if s.ByReplica["r1"] != s.Requests || s.ByRoute["load"] != s.Requests {
		t.Fatalf("headers not recorded: %+v", s)
	}
	if n := withoutSession.Load(); n != 0 {
		t.Fatalf("%d of %d requests carried no X-Session-Id", n, calls.Load())
	}
}
