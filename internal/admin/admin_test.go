package admin

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
)

// coreFleet is a Fleet straight on the balancer (the server adds scraping).
type coreFleet struct{ b *balancer.Balancer }

func (f coreFleet) AddReplica(s balancer.ReplicaSpec) error { return f.b.AddReplica(s, time.Now()) }
func (f coreFleet) RemoveReplica(name string) bool          { return f.b.RemoveReplica(name, time.Now()) }
func (f coreFleet) SetDraining(name string, d bool) bool    { return f.b.SetDraining(name, d) }

func newAdmin(t *testing.T, token string, replicas ...string) (http.Handler, *balancer.Balancer) {
	t.Helper()
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range replicas {
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name + ":8000", Models: []string{"m"}}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	h, err := NewHandler(Options{Balancer: bal, Fleet: coreFleet{bal}, Metrics: NewMetrics(bal, nil), Token: token})
	if err != nil {
		t.Fatal(err)
	}
	return h, bal
}

func do(h http.Handler, method, path, auth, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMutationsNeedTheToken(t *testing.T) {
	tests := []struct {
		name  string
		token string // configured
		auth  string // sent
		want  int
	}{
		{"no token configured: open", "", "", 200},
		{"token configured, none sent", "t0k", "", 401},
		{"wrong token", "t0k", "Bearer nope", 401},
		{"token prefix only", "t0k", "Bearer t0", 401},
		{"not a bearer", "t0k", "Basic t0k", 401},
		{"right token", "t0k", "Bearer t0k", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newAdmin(t, tt.token, "a")
			if got := do(h, "POST", "/admin/replicas/a/drain", tt.auth, "").Code; got != tt.want {
				t.Errorf("drain: %d, want %d", got, tt.want)
			}
			// Reads never need the token.
			if got := do(h, "GET", "/admin/replicas", "", "").Code; got != 200 {
				t.Errorf("GET /admin/replicas: %d", got)
			}
		})
	}
}

func TestAddReplica(t *testing.T) {
	tests := []struct {
		name, body string
		want       int
		wantName   string
	}{
		{"named", `{"name":"b","url":"http://10.0.0.2:8000","models":["m"]}`, 201, "b"},
		{"name defaults to host:port", `{"url":"http://10.0.0.3:8000/"}`, 201, "10.0.0.3:8000"},
		{"duplicate", `{"name":"a","url":"http://10.0.0.4:8000"}`, 409, ""},
		{"not http", `{"url":"ftp://10.0.0.5"}`, 400, ""},
		{"no url", `{"name":"c"}`, 400, ""},
		{"bad name", `{"name":"a/b","url":"http://10.0.0.6:8000"}`, 400, ""},
		{"unknown field", `{"url":"http://10.0.0.7:8000","weight":3}`, 400, ""},
		{"not JSON", `{`, 400, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, bal := newAdmin(t, "", "a")
			w := do(h, "POST", "/admin/replicas", "", tt.body)
			if w.Code != tt.want {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.want, w.Body)
			}
			if tt.want != 201 {
				var e struct {
					Error struct{ Message string } `json:"error"`
				}
				if json.Unmarshal(w.Body.Bytes(), &e) != nil || e.Error.Message == "" {
					t.Errorf("error body %q is not OpenAI-shaped", w.Body)
				}
				return
			}
			found := false
			for _, r := range bal.Replicas(time.Now()) {
				found = found || r.Name == tt.wantName
			}
			if !found {
				t.Errorf("replica %q not in the core after add", tt.wantName)
			}
		})
	}
}

func TestRemoveAndDrain(t *testing.T) {
	h, bal := newAdmin(t, "", "a", "b")
	steps := []struct {
		method, path string
		want         int
	}{
		{"POST", "/admin/replicas/a/drain", 200},
		{"POST", "/admin/replicas/a/undrain", 200},
		{"POST", "/admin/replicas/zz/drain", 404},
		{"DELETE", "/admin/replicas/b", 200},
		{"DELETE", "/admin/replicas/b", 404},
		{"GET", "/admin/replicas/a/drain", 405},
	}
	for _, s := range steps {
		if got := do(h, s.method, s.path, "", "").Code; got != s.want {
			t.Errorf("%s %s = %d, want %d", s.method, s.path, got, s.want)
		}
	}
	if n := len(bal.Replicas(time.Now())); n != 1 {
		t.Errorf("%d replicas left, want 1", n)
	}
}

func TestReadyz(t *testing.T) {
	tests := []struct {
		name     string
		replicas []string
		eject    bool
		want     int
	}{
		{"no replicas", nil, false, 503},
		{"a LIVE replica", []string{"a"}, false, 200},
		{"only an ejected replica", []string{"a"}, true, 503},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, bal := newAdmin(t, "", tt.replicas...)
			if tt.eject {
				bal.ObserveScrape("a", balancer.Snapshot{}, errors.New("refused"), time.Now())
			}
			if got := do(h, "GET", "/readyz", "", "").Code; got != tt.want {
				t.Errorf("readyz %d, want %d", got, tt.want)
			}
			if got := do(h, "GET", "/healthz", "", "").Code; got != 200 {
				t.Errorf("healthz %d, want 200", got)
			}
		})
	}
}

func TestListsAreJSONArrays(t *testing.T) {
	h, _ := newAdmin(t, "")
	for _, path := range []string{"/admin/replicas", "/admin/pins", "/admin/alerts"} {
		w := do(h, "GET", path, "", "")
		if w.Code != 200 || strings.TrimSpace(w.Body.String()) != "[]" {
			t.Errorf("GET %s = %d %q, want 200 []", path, w.Code, w.Body)
		}
	}
	if got := do(h, "GET", "/admin/pins?limit=x", "", "").Code; got != 400 {
		t.Errorf("bad limit: %d, want 400", got)
	}
}

func TestMetricsGather(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a:8000"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(bal, nil)
	m.Request("a", balancer.ReasonLoad, 200)
	m.FirstByte("a", 30*time.Millisecond)
	m.StreamError("a")
	m.Failover("a")
	m.Scrape("a", false)
	m.Transitions([]balancer.Transition{{Replica: "a"}})
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, name := range []string{
		"llmlb_requests_total", "llmlb_time_to_first_byte_seconds", "llmlb_stream_errors_total",
		"llmlb_failovers_total", "llmlb_scrapes_total", "llmlb_health_transitions_total",
		"llmlb_replica_in_flight", "llmlb_replica_effective_running", "llmlb_replica_effective_waiting",
		"llmlb_replica_state", "llmlb_pins", "llmlb_spills_total", "llmlb_rebinds_total", "llmlb_ejections_total",
		"llmlb_alerts_firing",
	} {
		if !have[name] {
			t.Errorf("metric %s missing", name)
		}
	}
	m.ForgetReplica("a")
}
