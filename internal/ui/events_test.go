package ui

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/request"
)

// serve mounts d on a test server.
func serve(t *testing.T, d *Dashboard) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	d.Register(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		d.Close()
		srv.Close()
	})
	return srv
}

// stream is an open event stream.
type stream struct {
	resp *http.Response
	r    *bufio.Reader
}

func openStream(t *testing.T, url, token string) *stream {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url+"/admin/events", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &stream{resp: resp, r: bufio.NewReader(resp.Body)}
}

// next reads the next snapshot event.
func (s *stream) next(t *testing.T) *Snapshot {
	t.Helper()
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the stream: %v", err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var snap Snapshot
			if err := json.Unmarshal([]byte(data), &snap); err != nil {
				t.Fatalf("bad snapshot %q: %v", data, err)
			}
			return &snap
		}
	}
}

func TestEventStream(t *testing.T) {
	d, bal, clk := newTestDashboard(t, Options{Token: "secret", MaxSubscribers: 2})
	d.local = func(*http.Request) bool { return false } // as if from another host
	route(t, d, bal, &request.Profile{SessionKey: "alice-1"}, t0)
	srv := serve(t, d)

	anon := openStream(t, srv.URL, "")
	if ct := anon.resp.Header.Get("Content-Type"); anon.resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, content type %q", anon.resp.StatusCode, ct)
	}
	s := anon.next(t)
	if s.Authorized || !s.TokenConfigured || len(s.Replicas) != 3 || len(s.Decisions) != 1 {
		t.Fatalf("anonymous snapshot = %+v", s)
	}
	if got := s.Decisions[0].Session; got != fingerprint("alice-1") {
		t.Errorf("anonymous stream sees session %q, want its fingerprint", got)
	}

	admin := openStream(t, srv.URL, "secret")
	if s := admin.next(t); !s.Authorized || s.Decisions[0].Session != "alice-1" {
		t.Errorf("stream with the token: authorized %v, session %q", s.Authorized, s.Decisions[0].Session)
	}

	// A third stream is over the limit.
	resp, err := http.Get(srv.URL + "/admin/events")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("third stream: status %d, want 503", resp.StatusCode)
	}

	// Publishing never waits for subscribers, even ones that read nothing;
	// each wakes up to the latest snapshot.
	for i := 1; i <= 50; i++ {
		clk.set(t0.Add(time.Duration(i) * time.Second))
		d.publish(clk.now())
	}
	route(t, d, bal, &request.Profile{SessionKey: "bob"}, clk.now())
	clk.set(clk.now().Add(time.Second))
	d.publish(clk.now())
	var last *Snapshot
	for last == nil || !last.At.Equal(clk.now()) {
		last = admin.next(t)
	}
	if last.Decisions[0].Session != "bob" {
		t.Errorf("latest snapshot's newest decision is %q, want bob", last.Decisions[0].Session)
	}

	// Close ends the open streams.
	d.Close()
	done := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, anon.r); done <- err }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("stream still open after Close")
	}
}

func TestPageIsSelfContained(t *testing.T) {
	d, _, _ := newTestDashboard(t, Options{})
	srv := serve(t, d)
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/ui", "text/html; charset=utf-8", `<script src="/ui/app.js"`},
		{"/ui/", "text/html; charset=utf-8", `<table id="replicas">`},
		{"/ui/app.js", "text/javascript; charset=utf-8", "/admin/events"},
		{"/ui/app.css", "text/css; charset=utf-8", "--ejected"},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != tc.ctype {
			t.Errorf("%s: status %d, type %q", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Errorf("%s: CSP %q", tc.path, csp)
		}
		if !strings.Contains(string(body), tc.contains) {
			t.Errorf("%s lacks %q", tc.path, tc.contains)
		}
		// Works offline: nothing is loaded from another origin, and the
		// token never goes into a URL.
		for _, bad := range []string{"http://", "https://", "//cdn", "?token", "&token"} {
			if strings.Contains(string(body), bad) {
				t.Errorf("%s contains %q", tc.path, bad)
			}
		}
	}
}

// TestSetAccess checks that a reloaded token applies to the next stream and
// snapshot, and that open_mutations says whether mutations need no token.
func TestSetAccess(t *testing.T) {
	d, bal, _ := newTestDashboard(t, Options{OpenMutations: true})
	route(t, d, bal, &request.Profile{SessionKey: "alice-1"}, t0)
	srv := serve(t, d)
	if s := openStream(t, srv.URL, "").next(t); !s.Authorized || s.TokenConfigured || !s.OpenMutations {
		t.Errorf("no token: authorized %v, token configured %v, open mutations %v; want true, false, true",
			s.Authorized, s.TokenConfigured, s.OpenMutations)
	}
	d.SetAccess("new-token", true)
	d.publish(t0.Add(time.Second))
	if s := openStream(t, srv.URL, "old").next(t); s.Authorized || s.OpenMutations || s.Decisions[0].Session == "alice-1" {
		t.Errorf("wrong token after the reload: authorized %v, open mutations %v, session %q",
			s.Authorized, s.OpenMutations, s.Decisions[0].Session)
	}
	if s := openStream(t, srv.URL, "new-token").next(t); !s.Authorized || s.Decisions[0].Session != "alice-1" {
		t.Errorf("the reloaded token: authorized %v, session %q", s.Authorized, s.Decisions[0].Session)
	}
	d.SetAccess("", false)
	if s := d.Snapshot(t0); s.OpenMutations || s.TokenConfigured {
		t.Errorf("no token and mutations off: open mutations %v, token configured %v", s.OpenMutations, s.TokenConfigured)
	}
}
