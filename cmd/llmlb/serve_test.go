package main

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/server"
)

// adminDo sends one admin request as curl on the admin host would.
func adminDo(h http.Handler, method, path, auth string) int {
	r := httptest.NewRequest(method, path, nil)
	r.Host = "127.0.0.1:9090"
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code
}

// docs/SECURITY.md [13]: an admin_token added to the file and applied by SIGHUP guards
// the admin API at once (it used to be ignored until a restart); a reload
// of an invalid file changes nothing, says so at ERROR and is counted.
func TestReloadAppliesAdminToken(t *testing.T) {
	rs := newReloadServer(t, "admin:\n  allow_unauthenticated_mutations: true\n")
	write, args, srv, logger, logs := rs.write, rs.args, rs.srv, rs.logger, rs.logs
	h := srv.AdminHandler()
	// Opted in on loopback: the mutation reaches the fleet (404: no such replica).
	if got := adminDo(h, "POST", "/admin/replicas/ghost/drain", ""); got != http.StatusNotFound {
		t.Fatalf("before reload: drain = %d, want 404", got)
	}

	write("admin_token: s3cret-reloaded\n")
	reload(args, srv, logger)
	for _, c := range []struct {
		method, path, auth string
		want               int
	}{
		{"POST", "/admin/replicas/ghost/drain", "", http.StatusUnauthorized},
		{"POST", "/admin/replicas/ghost/drain", "Bearer s3cret-reloaded", http.StatusNotFound},
		{"GET", "/admin/pins", "", http.StatusUnauthorized},
		{"GET", "/admin/pins", "Bearer s3cret-reloaded", http.StatusOK},
	} {
		if got := adminDo(h, c.method, c.path, c.auth); got != c.want {
			t.Errorf("after reload: %s %s (%q) = %d, want %d", c.method, c.path, c.auth, got, c.want)
		}
	}

	write("admin_token: [not, a, string]\n")
	reload(args, srv, logger)
	if got := adminDo(h, "POST", "/admin/replicas/ghost/drain", ""); got != http.StatusUnauthorized {
		t.Errorf("a rejected reload changed the access: %d", got)
	}
	if !strings.Contains(logs.String(), "level=ERROR msg=\"reload: configuration rejected") {
		t.Errorf("no ERROR for the rejected reload:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "s3cret-reloaded") {
		t.Error("the token was logged")
	}
	mfs, err := srv.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	results := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "llmlb_config_reloads_total" {
			for _, m := range mf.GetMetric() {
				results[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if results["applied"] != 1 || results["rejected"] != 1 {
		t.Errorf("llmlb_config_reloads_total = %v, want applied 1, rejected 1", results)
	}
}

// docs/SECURITY.md [13]: serve on a non-loopback admin address without a token warns
// at start (it keeps running: reads for monitoring, mutations disabled).
func TestServeWarnsAboutAnExposedAdmin(t *testing.T) {
	cfg, err := serveConfig([]string{"--admin-listen", "0.0.0.0:9090"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	logWarnings(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if !strings.Contains(logs.String(), "level=WARN msg=\"SECURITY: admin_listen \\\"0.0.0.0:9090\\\" is reachable from the network and admin_token is not set") {
		t.Errorf("no warning:\n%s", logs.String())
	}
	cfg, err = serveConfig([]string{"--admin-listen", "127.0.0.1:9090"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	logWarnings(cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if logs.Len() != 0 {
		t.Errorf("warning on loopback: %s", logs.String())
	}
}

// TestReloadAppliesRouting: a reload applies routing settings to the running
// core and refuses a policy change, naming it.
func TestReloadAppliesRouting(t *testing.T) {
	rs := newReloadServer(t, "routing:\n  policy: cost\n  cost:\n    bounded_load: 2\n")
	write, args, srv, logger, logs := rs.write, rs.args, rs.srv, rs.logger, rs.logs
	write("routing:\n  policy: cost\n  cost:\n    bounded_load: 1.25\n  affinity:\n    session_ttl: 5m\n")
	reload(args, srv, logger)
	got := srv.Balancer().Config()
	if got.Cost.BoundedLoad != 1.25 || got.Affinity.SessionTTL != 5*time.Minute {
		t.Fatalf("after reload: bounded_load %v, session_ttl %v; want 1.25 and 5m", got.Cost.BoundedLoad, got.Affinity.SessionTTL)
	}
	write("routing:\n  policy: rr\n")
	reload(args, srv, logger)
	if p := srv.Balancer().Policy(); p != "cost" {
		t.Fatalf("policy after a reload asking for rr = %s, want cost (it needs a restart)", p)
	}
	if !strings.Contains(logs.String(), "needs a restart") {
		t.Fatalf("the refused policy change is not logged:\n%s", logs.String())
	}
}

// reloadServer is a server built from a config file the test rewrites
// before calling reload.
type reloadServer struct {
	write  func(body string)
	args   []string
	srv    *server.Server
	logger *slog.Logger
	logs   *bytes.Buffer
}

func newReloadServer(t *testing.T, body string) reloadServer {
	t.Helper()
	file := filepath.Join(t.TempDir(), "llmlb.yaml")
	rs := reloadServer{logs: &bytes.Buffer{}}
	rs.write = func(body string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rs.write(body)
	rs.args = []string{"--config", file, "--listen", "127.0.0.1:0", "--admin-listen", "localhost:0"}
	cfg, err := serveConfig(rs.args, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	rs.logger = slog.New(slog.NewTextHandler(rs.logs, nil))
	if rs.srv, err = server.New(cfg, rs.logger); err != nil {
		t.Fatal(err)
	}
	return rs
}

// TestReloadRefusesFlowControlChanges: flow_control is read at start; a
// reload that changes it is refused with an error naming it and counted as
// partial, while the rest of the file applies.
func TestReloadRefusesFlowControlChanges(t *testing.T) {
	rs := newReloadServer(t, "flow_control:\n  max_queued: 100\n")
	rs.write("flow_control:\n  max_queued: 100\nrouting:\n  affinity:\n    session_ttl: 7m\n")
	reload(rs.args, rs.srv, rs.logger)
	if strings.Contains(rs.logs.String(), "flow_control") {
		t.Fatalf("an unchanged flow_control was refused:\n%s", rs.logs.String())
	}
	rs.write("flow_control:\n  max_queued: 5\nrouting:\n  affinity:\n    session_ttl: 9m\n")
	reload(rs.args, rs.srv, rs.logger)
	if !strings.Contains(rs.logs.String(), "flow_control not applied") || !strings.Contains(rs.logs.String(), "needs a restart") {
		t.Fatalf("the changed flow_control is not refused:\n%s", rs.logs.String())
	}
	if got := rs.srv.Gate().Config().MaxQueued; got != 100 {
		t.Errorf("max_queued %d after the refused reload, want 100", got)
	}
	if got := rs.srv.Balancer().Config().Affinity.SessionTTL; got != 9*time.Minute {
		t.Errorf("session_ttl %v: the rest of the reload did not apply", got)
	}
	mfs, err := rs.srv.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "llmlb_config_reloads_total" {
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if counts["applied"] != 1 || counts["partial"] != 1 {
		t.Errorf("reloads counted %v, want one applied and one partial", counts)
	}
}
