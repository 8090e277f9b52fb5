package server

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/ui"
)

// TestDashboardOnTheAdminListener checks that the admin listener serves the
// dashboard and its event stream beside the admin API, that a routed request
// shows up as an explained decision, and that an open event stream does not
// hold up shutdown (a stream is never idle).
func TestDashboardOnTheAdminListener(t *testing.T) {
	e := start(t, 2, func(c *config.Config) { c.Server.ShutdownTimeout = time.Minute })

	resp, err := e.http.Get(e.admin + "/ui")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui: status %d, type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if got := e.replicas(); len(got) != 2 { // the admin API is still there
		t.Fatalf("/admin/replicas lists %d replicas, want 2", len(got))
	}

	if code, _, body := e.chat(chatBody("hello", 4), map[string]string{"X-Session-Id": "dash-1"}); code != 200 {
		t.Fatalf("chat: %d %s", code, body)
	}
	resp, err = e.http.Get(e.admin + "/admin/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("GET /admin/events: type %q", ct)
	}
	r := bufio.NewReader(resp.Body)
	var snap ui.Snapshot
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			if err := json.Unmarshal([]byte(data), &snap); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if len(snap.Replicas) != 2 || len(snap.Decisions) == 0 {
		t.Fatalf("snapshot has %d replicas and %d decisions, want 2 and some", len(snap.Replicas), len(snap.Decisions))
	}
	if d := snap.Decisions[0]; d.Session != "dash-1" || d.Why == "" || d.Attempt != 1 {
		t.Errorf("decision = %+v, want dash-1's first attempt, explained", d)
	}

	// Shutdown with the stream still open: it ends the stream instead of
	// waiting for server.shutdown_timeout (a minute here).
	stopped := time.Now()
	e.stop()
	select {
	case err := <-e.done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		e.done <- nil // for the cleanup
	case <-time.After(30 * time.Second):
		t.Fatal("the server waited for the event stream to end")
	}
	t.Logf("stopped in %v with an event stream open", time.Since(stopped).Round(time.Millisecond))
}
