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

// A stream is relayed through a copy buffer of streamCopyBufferSize: an
// event larger than it, and a burst of many events in one write, still
// arrive whole and in order, and a JSON answer to a streaming request
// larger than the buffer is not cut.
func TestStreamLargerThanItsCopyBuffer(t *testing.T) {
	big := `data: {"choices":[{"delta":{"content":"` + strings.Repeat("b", 3*streamCopyBufferSize) + `"}}]}` + "\n\n"
	var burst strings.Builder
	for i := range 200 {
		burst.WriteString(`data: {"choices":[{"delta":{"content":"` + strings.Repeat("c", i%50) + `"}}]}` + "\n\n")
	}
	done := "data: [DONE]\n\n"
	jsonAnswer := `{"error":{"message":"` + strings.Repeat("j", 3*streamCopyBufferSize) + `"}}`
	cases := []struct {
		name, contentType, answer string
	}{
		{"one event over the buffer", "text/event-stream", big + done},
		{"a burst of events in one write", "text/event-stream", burst.String() + done},
		{"a JSON answer over the buffer", "application/json", jsonAnswer},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", c.contentType)
				_, _ = w.Write([]byte(c.answer))
			}))
			t.Cleanup(up.Close)
			f := newFixture(t, defaultProxyConfig(), replica{name: "a", url: up.URL})
			code, body, err := postTo(f.front(t).URL, streamBody)
			if err != nil || code != http.StatusOK {
				t.Fatalf("status %d, read error %v", code, err)
			}
			if body != c.answer {
				t.Fatalf("relayed %d bytes, want the replica's %d unchanged", len(body), len(c.answer))
			}
		})
	}
}
