package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/openai"
)

// A replica sending a 1 MB SSE line without a newline, then stalling, kept
// about 0.9 MB per stream (300 streams: +276 MB) against the ~140 KiB
// budget, for as long as the stall lasted. A line longer than
// openai.MaxSSELine ends the stream with the SSE error event at once.
func TestOverlongSSELineEndsTheStream(t *testing.T) {
	stall := make(chan struct{})
	t.Cleanup(func() { close(stall) })
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(`data: {"choices":[{"delta":{"content":"a"}}]}` + "\n\n"))
		_, _ = w.Write([]byte(`data: {"x":"` + strings.Repeat("x", 1<<20)))
		w.(http.Flusher).Flush()
		select {
		case <-stall:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	cfg := defaultProxyConfig()
	cfg.StreamIdleTimeout = time.Hour // only the line bound may end it
	f := newFixture(t, cfg, replica{name: "a", url: up.URL})
	code, body, err := postTo(f.front(t).URL, streamBody)
	if err != nil || code != http.StatusOK {
		t.Fatalf("status %d, read error %v", code, err)
	}
	if !strings.Contains(body, openai.CodeStreamBroken) || !strings.Contains(body, "longer than") {
		t.Fatalf("the stream did not end with the error event about the line: ...%q", body[max(0, len(body)-300):])
	}
	if len(body) > 2*openai.MaxSSELine {
		t.Errorf("relayed %d bytes of the overlong line, want at most about %d", len(body), openai.MaxSSELine)
	}
}
