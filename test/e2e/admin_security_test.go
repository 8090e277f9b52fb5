//go:build e2e

package e2e

import (
	"context"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestAdminPortSafety runs docs/SECURITY.md's admin-port defences [2], [3]
// and [13] against the real
// process with its default configuration (no admin_token): a browser page
// cannot add a replica (mutations are off without a token; text/plain and
// foreign Origins are refused; a DNS-rebinding Host is refused), and an
// admin_token added to the file and applied by SIGHUP guards the port at once.
// The rules themselves are tabled in internal/admin's tests.
func TestAdminPortSafety(t *testing.T) {
	fake := newFakeReplica(t)
	cfg := "replicas:\n  - name: fake\n    url: " + fake.srv.URL + "\n    models: [sim-model]\n"
	srv := startServe(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	send := func(method, path, body string, header map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, method, srv.admin+path, strings.NewReader(body))
		for k, v := range header {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		res, err := httpClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(b)
	}
	add := `{"name":"evil","url":"http://127.0.0.1:1"}`
	for _, c := range []struct {
		name         string
		method, path string
		body         string
		header       map[string]string
		want         int
	}{
		{"a page's text/plain POST", "POST", "/admin/replicas", add,
			map[string]string{"Content-Type": "text/plain", "Origin": "https://evil.example"}, 403},
		{"a page's drain", "POST", "/admin/replicas/fake/drain", "", map[string]string{"Origin": "https://evil.example"}, 403},
		{"curl without a token: mutations are off", "POST", "/admin/replicas", add,
			map[string]string{"Content-Type": "application/json"}, 403},
		{"curl drain without a token", "POST", "/admin/replicas/fake/drain", "", nil, 403},
		{"DNS rebinding read", "GET", "/admin/replicas", "", map[string]string{"Host": "rebind.evil.example"}, 421},
		{"DNS rebinding mutation", "POST", "/admin/replicas/fake/drain", "", map[string]string{"Host": "rebind.evil.example"}, 421},
		{"reads by curl", "GET", "/admin/replicas", "", nil, 200},
		{"pins without a token configured", "GET", "/admin/pins?limit=0", "", nil, 200},
	} {
		if got, body := send(c.method, c.path, c.body, c.header); got != c.want {
			t.Errorf("%s: %s %s = %d, want %d: %s", c.name, c.method, c.path, got, c.want, body)
		}
	}
	if r := srv.replicas(t); r["evil"].Name != "" || r["fake"].Draining {
		t.Fatalf("a refused mutation changed the fleet: %+v", r)
	}

	// docs/SECURITY.md: the operator adds a token and sends SIGHUP.
	srv.writeConfig(t, cfg+"admin_token: e2e-reloaded-Qx7\n")
	srv.p.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the reloaded token to guard /admin/pins", func() (bool, string) {
		got, _ := send("GET", "/admin/pins", "", nil)
		return got == http.StatusUnauthorized, "pins still open"
	})
	if got, body := send("POST", "/admin/replicas/fake/drain", "", nil); got != http.StatusUnauthorized {
		t.Errorf("drain without the reloaded token: %d %s", got, body)
	}
	auth := map[string]string{"Authorization": "Bearer e2e-reloaded-Qx7"}
	if got, body := send("POST", "/admin/replicas/fake/drain", "", auth); got != http.StatusOK {
		t.Errorf("drain with the reloaded token: %d %s", got, body)
	}
	if got, body := send("POST", "/admin/replicas/fake/undrain", "", auth); got != http.StatusOK {
		t.Errorf("undrain with the reloaded token: %d %s", got, body)
	}
	if srv.p.exited() {
		t.Fatalf("llmlb serve exited:\n%s", srv.p.out.String())
	}
	if strings.Contains(srv.p.out.String(), "e2e-reloaded-Qx7") {
		t.Error("the admin token appeared in the log")
	}
}
