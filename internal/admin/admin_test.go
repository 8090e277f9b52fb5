package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/testutil/pinview"
)

// coreFleet is a Fleet straight on the balancer (the server adds scraping).
type coreFleet struct{ b *balancer.Balancer }

func (f coreFleet) AddReplica(s balancer.ReplicaSpec, _ KVEvents) error {
	return f.b.AddReplica(s, time.Now())
}
func (f coreFleet) RemoveReplica(name string) bool       { return f.b.RemoveReplica(name, time.Now()) }
func (f coreFleet) SetDraining(name string, d bool) bool { return f.b.SetDraining(name, d) }

func newAdmin(t *testing.T, token string, replicas ...string) (*Handler, *balancer.Balancer) {
	t.Helper()
	return newAdminWith(t, Options{Token: token, AllowUnauthenticatedMutations: token == ""}, replicas...)
}

// newAdminWith builds the handler on a fresh balancer; Listen defaults to
// the default admin address (loopback).
func newAdminWith(t *testing.T, o Options, replicas ...string) (*Handler, *balancer.Balancer) {
	t.Helper()
	return newAdminCfg(t, balancer.DefaultConfig(), o, replicas...)
}

func newAdminCfg(t *testing.T, cfg balancer.Config, o Options, replicas ...string) (*Handler, *balancer.Balancer) {
	t.Helper()
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range replicas {
		if err := bal.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name + ":8000", Models: []string{"m"}}, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	o.Balancer, o.Fleet, o.Metrics = bal, coreFleet{bal}, NewMetrics(bal, nil)
	if o.Listen == "" {
		o.Listen = "127.0.0.1:9090"
	}
	h, err := NewHandler(o)
	if err != nil {
		t.Fatal(err)
	}
	return h, bal
}

// do sends a request as curl on the admin host would: Host 127.0.0.1:9090,
// a JSON body declared as such, no Origin.
func do(h http.Handler, method, path, auth, body string) *httptest.ResponseRecorder {
	return doWith(h, method, path, body, map[string]string{"Authorization": auth})
}

// doWith sends a request with extra headers ("Host" sets the Host; an
// empty value leaves a header out; Content-Type defaults to JSON when there
// is a body).
func doWith(h http.Handler, method, path, body string, headers map[string]string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Host = "127.0.0.1:9090"
	if body != "" {
		r.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		switch {
		case k == "Host":
			r.Host = v
		case v == "":
			r.Header.Del(k)
		default:
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestMutationsNeedTheToken(t *testing.T) {
	tests := []struct {
		name   string
		token  string // configured
		optIn  bool   // admin.allow_unauthenticated_mutations
		listen string // admin_listen
		auth   string // sent
		want   int
	}{
		// docs/SECURITY.md: with no token, mutations are off unless the operator
		// opts in, and the opt-in counts only on loopback.
		{"no token: mutations off", "", false, "", "", 403},
		{"no token, opted in, loopback", "", true, "", "", 200},
		{"no token, opted in, localhost", "", true, "localhost:9090", "", 200},
		{"no token, opted in, but on the network", "", true, "0.0.0.0:9090", "", 403},
		{"no token, opted in, all interfaces", "", true, ":9090", "", 403},
		{"token configured, none sent", "t0k", false, "", "", 401},
		{"token configured and opt-in: the token wins", "t0k", true, "", "", 401},
		{"wrong token", "t0k", false, "", "Bearer nope", 401},
		{"token prefix only", "t0k", false, "", "Bearer t0", 401},
		{"not a bearer", "t0k", false, "", "Basic t0k", 401},
		{"right token", "t0k", false, "", "Bearer t0k", 200},
		{"right token on the network", "t0k", false, "0.0.0.0:9090", "Bearer t0k", 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newAdminWith(t, Options{Token: tt.token, AllowUnauthenticatedMutations: tt.optIn, Listen: tt.listen}, "a")
			w := do(h, "POST", "/admin/replicas/a/drain", tt.auth, "")
			if w.Code != tt.want {
				t.Errorf("drain: %d, want %d: %s", w.Code, tt.want, w.Body)
			}
			if tt.want == 403 && !strings.Contains(w.Body.String(), "admin_token") {
				t.Errorf("403 does not say how to enable mutations: %s", w.Body)
			}
			// Replica state is readable without the token.
			if got := do(h, "GET", "/admin/replicas", "", "").Code; got != 200 {
				t.Errorf("GET /admin/replicas: %d", got)
			}
		})
	}
}

// docs/SECURITY.md: a web page must not reach the mutations: a cross-origin
// request (Origin or Sec-Fetch-Site), a CORS-simple body (text/plain, form),
// and a DNS-rebinding name in Host are refused, even with mutations open.
func TestCrossSiteRequestsAreRefused(t *testing.T) {
	add := `{"name":"evil","url":"http://10.9.9.9:8000"}`
	tests := []struct {
		name         string
		method, path string
		body         string
		headers      map[string]string
		want         int
	}{
		{"same-origin add (curl)", "POST", "/admin/replicas", add, nil, 201},
		{"foreign Origin add", "POST", "/admin/replicas", add, map[string]string{"Origin": "https://evil.example"}, 403},
		{"foreign Origin drain", "POST", "/admin/replicas/a/drain", "", map[string]string{"Origin": "https://evil.example"}, 403},
		{"foreign Origin delete", "DELETE", "/admin/replicas/a", "", map[string]string{"Origin": "http://evil.example"}, 403},
		{"null Origin drain", "POST", "/admin/replicas/a/drain", "", map[string]string{"Origin": "null"}, 403},
		{"Sec-Fetch-Site cross-site", "POST", "/admin/replicas/a/drain", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"Sec-Fetch-Site same-site", "POST", "/admin/replicas/a/drain", "", map[string]string{"Sec-Fetch-Site": "same-site"}, 403},
		{"Sec-Fetch-Site same-origin", "POST", "/admin/replicas/a/drain", "", map[string]string{"Sec-Fetch-Site": "same-origin"}, 200},
		{"Origin of the admin listener", "POST", "/admin/replicas/a/drain", "", map[string]string{"Origin": "http://127.0.0.1:9090"}, 200},
		{"text/plain add (CORS-simple)", "POST", "/admin/replicas", add, map[string]string{"Content-Type": "text/plain"}, 415},
		{"form add (CORS-simple)", "POST", "/admin/replicas", add, map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415},
		{"add without Content-Type", "POST", "/admin/replicas", add, map[string]string{"Content-Type": ""}, 415},
		{"add with JSON and charset", "POST", "/admin/replicas", add, map[string]string{"Content-Type": "application/json; charset=utf-8"}, 201},
		// DNS rebinding: the page's own name arrives in Host.
		{"rebinding name on a read", "GET", "/admin/replicas", "", map[string]string{"Host": "evil.example:9090"}, 421},
		{"rebinding name on pins", "GET", "/admin/pins", "", map[string]string{"Host": "evil.example"}, 421},
		{"rebinding name on alerts", "GET", "/admin/alerts", "", map[string]string{"Host": "evil.example"}, 421},
		{"rebinding name on a mutation", "POST", "/admin/replicas/a/drain", "", map[string]string{"Host": "rebind.evil.example:9090"}, 421},
		{"localhost", "GET", "/admin/replicas", "", map[string]string{"Host": "localhost:9090"}, 200},
		{"LOCALHOST.", "GET", "/admin/replicas", "", map[string]string{"Host": "LOCALHOST.:9090"}, 200},
		{"IPv6 loopback", "GET", "/admin/replicas", "", map[string]string{"Host": "[::1]:9090"}, 200},
		{"an IP literal", "GET", "/admin/replicas", "", map[string]string{"Host": "10.1.2.3:9090"}, 200},
		{"a configured name", "GET", "/admin/replicas", "", map[string]string{"Host": "llmlb.internal:9090"}, 200},
		{"probes answer any Host", "GET", "/healthz", "", map[string]string{"Host": "evil.example"}, 200},
		{"Prometheus by a service name", "GET", "/metrics", "", map[string]string{"Host": "llmlb:9090"}, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, _ := newAdminWith(t, Options{AllowUnauthenticatedMutations: true, AllowedHosts: []string{"llmlb.internal"}}, "a")
			w := doWith(h, tt.method, tt.path, tt.body, tt.headers)
			if w.Code != tt.want {
				t.Errorf("%s %s = %d, want %d: %s", tt.method, tt.path, w.Code, tt.want, w.Body)
			}
		})
	}
	t.Run("allowed_hosts *", func(t *testing.T) {
		h, _ := newAdminWith(t, Options{AllowedHosts: []string{"*"}})
		if w := doWith(h, "GET", "/admin/replicas", "", map[string]string{"Host": "anything.example"}); w.Code != 200 {
			t.Errorf("%d", w.Code)
		}
	})
	t.Run("the listen address's own name", func(t *testing.T) {
		h, _ := newAdminWith(t, Options{Listen: "admin.example:9090"})
		if w := doWith(h, "GET", "/admin/replicas", "", map[string]string{"Host": "admin.example:9090"}); w.Code != 200 {
			t.Errorf("%d", w.Code)
		}
	})
}

// docs/SECURITY.md: a token that appears on reload applies to the next request.
func TestSetAccessAppliesAtOnce(t *testing.T) {
	h, _ := newAdminWith(t, Options{AllowUnauthenticatedMutations: true}, "a")
	if got := do(h, "POST", "/admin/replicas/a/drain", "", "").Code; got != 200 {
		t.Fatalf("before: %d", got)
	}
	if got := do(h, "GET", "/admin/pins", "", "").Code; got != 200 {
		t.Fatalf("pins before: %d", got)
	}
	h.SetAccess(Access{Token: "n3w", AllowUnauthenticatedMutations: true})
	for _, c := range []struct {
		method, path, auth string
		want               int
	}{
		{"POST", "/admin/replicas/a/drain", "", 401},
		{"POST", "/admin/replicas/a/undrain", "Bearer n3w", 200},
		{"GET", "/admin/pins", "", 401},
		{"GET", "/admin/pins", "Bearer n3w", 200},
		{"GET", "/admin/replicas", "", 200},
	} {
		if got := do(h, c.method, c.path, c.auth, "").Code; got != c.want {
			t.Errorf("after SetAccess: %s %s (%q) = %d, want %d", c.method, c.path, c.auth, got, c.want)
		}
	}
	h.SetAccess(Access{AllowedHosts: []string{"new.example"}})
	if got := doWith(h, "GET", "/admin/replicas", "", map[string]string{"Host": "new.example"}).Code; got != 200 {
		t.Errorf("allowed host added on reload: %d", got)
	}
	if got := do(h, "POST", "/admin/replicas/a/drain", "", "").Code; got != 403 {
		t.Errorf("opt-in withdrawn on reload: %d, want 403", got)
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
		// docs/SECURITY.md: the configuration's rules apply to the API too.
		{"name not UTF-8", "{\"name\":\"gpu\xff\",\"url\":\"http://10.0.0.8:8000\"}", 400, ""},
		{"name with NUL", `{"name":"gpu\u0000","url":"http://10.0.0.8:8000"}`, 400, ""},
		{"name with a quote", `{"name":"gpu\"1","url":"http://10.0.0.8:8000"}`, 400, ""},
		{"name with a newline", `{"name":"gpu\n1","url":"http://10.0.0.8:8000"}`, 400, ""},
		{"name too long", `{"name":"` + strings.Repeat("g", 64) + `","url":"http://10.0.0.8:8000"}`, 400, ""},
		{"name of 63", `{"name":"` + strings.Repeat("g", 63) + `","url":"http://10.0.0.8:8000"}`, 201, strings.Repeat("g", 63)},
		{"url with credentials", `{"name":"c","url":"http://u:pw@10.0.0.8:8000"}`, 400, ""},
		{"url with a query", `{"name":"c","url":"http://10.0.0.8:8000/?x=1"}`, 400, ""},
		{"url with a fragment", `{"name":"c","url":"http://10.0.0.8:8000/#x"}`, 400, ""},
		{"url ending in /v1", `{"name":"c","url":"http://10.0.0.8:8000/v1"}`, 400, ""},
		{"same url under another name", `{"name":"c","url":"http://a:8000"}`, 409, ""},
		{"same url written differently", `{"name":"c","url":"HTTP://A:8000/"}`, 409, ""},
		{"empty model", `{"name":"c","url":"http://10.0.0.8:8000","models":[""]}`, 400, ""},
		{"with KV events", `{"name":"kv","url":"http://10.0.0.9:8000","kv_events":"tcp://10.0.0.9:5557","kv_events_replay":"tcp://10.0.0.9:5558"}`, 201, "kv"},
		{"KV events not tcp", `{"name":"kv","url":"http://10.0.0.9:8000","kv_events":"http://10.0.0.9:5557"}`, 400, ""},
		{"KV events without a port", `{"name":"kv","url":"http://10.0.0.9:8000","kv_events":"tcp://10.0.0.9"}`, 400, ""},
		{"KV replay without events", `{"name":"kv","url":"http://10.0.0.9:8000","kv_events_replay":"tcp://10.0.0.9:5558"}`, 400, ""},
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
		"llmlb_replica_state", "llmlb_pins", "llmlb_pin_bytes", "llmlb_pin_evictions_total", "llmlb_spills_total", "llmlb_rebinds_total", "llmlb_ejections_total",
		"llmlb_alerts_firing",
	} {
		if !have[name] {
			t.Errorf("metric %s missing", name)
		}
	}
	m.ForgetReplica("a")
}

// docs/SECURITY.md [11], defence in depth: a URL with credentials that reached the core
// some other way is shown without them.
func TestReplicasNeverShowCredentials(t *testing.T) {
	h, bal := newAdmin(t, "")
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "x", URL: "http://user:hunter2@10.0.0.1:8000"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	w := do(h, "GET", "/admin/replicas", "", "")
	if strings.Contains(w.Body.String(), "hunter2") || strings.Contains(w.Body.String(), "user@") {
		t.Fatalf("credentials shown: %s", w.Body)
	}
	if !strings.Contains(w.Body.String(), `"url": "http://10.0.0.1:8000"`) {
		t.Errorf("url not shown without credentials: %s", w.Body)
	}
}

// docs/SECURITY.md: a replica name that is not UTF-8 panicked the metrics on the
// first scrape. Whatever reaches the metrics, nothing panics.
func TestMetricsSurviveBadLabelValues(t *testing.T) {
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	bad := "gpu\xff\x00\"{}"
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: bad, URL: "http://a:8000"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	m := NewMetrics(bal, nil)
	m.Scrape(bad, true)
	m.Scrape(bad, false)
	m.Request(bad, balancer.Reason("\xfe"), 200)
	m.FirstByte(bad, time.Millisecond)
	m.StreamError(bad)
	m.Failover(bad)
	m.Transitions([]balancer.Transition{{Replica: bad}})
	m.Reload("applied")
	if _, err := m.Registry().Gather(); err != nil {
		t.Logf("gather reported: %v", err) // reported, not a panic
	}
	w := httptest.NewRecorder()
	promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{}).ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(w.Body.String(), "llmlb_scrapes_total") {
		t.Errorf("/metrics lost the scrape counter: %.300s", w.Body)
	}
	m.ForgetReplica(bad)
}

// lockProbe is a ResponseWriter that, when the answer is written, checks
// that the routing core's lock is free: it takes it from another goroutine.
type lockProbe struct {
	*httptest.ResponseRecorder
	bal    *balancer.Balancer
	t      *testing.T
	probed bool
}

func (p *lockProbe) Write(b []byte) (int, error) {
	if !p.probed {
		p.probed = true
		got := make(chan struct{})
		go func() { pinview.Counts(p.bal); close(got) }()
		select {
		case <-got:
		case <-time.After(time.Minute): // a deadlock, not a slow machine
			p.t.Fatal("the routing lock is held while the answer is written")
		}
	}
	return p.ResponseRecorder.Write(b)
}

// docs/SECURITY.md: with 1M pins, GET /admin/pins?limit=0 is one bounded page with a
// cursor to the next (not a 443 MB answer), the lock is free while the
// answer is written, and the token is needed when one is set.
func TestPinsArePagedAndBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("1M pins")
	}
	cfg := balancer.DefaultConfig()
	cfg.Policy = policy.NameLLMLB      // the policy that keeps pins
	cfg.Affinity.MaxPinBytes = 1 << 30 // room for all 1M
	h, bal := newAdminCfg(t, cfg, Options{Token: "t0k"}, "a", "b")
	now := time.Now()
	const n = 1_000_000
	for i := range n {
		res, err := bal.Select(&balancer.Profile{Model: "m", SessionKey: fmt.Sprintf("session-%07d", i)}, now)
		if err != nil {
			t.Fatal(err)
		}
		bal.Release(res, balancer.OutcomeOK, now)
	}
	if s, _ := pinview.Counts(bal); s != n {
		t.Fatalf("%d session pins, want %d", s, n)
	}
	if got := do(h, "GET", "/admin/pins?limit=0", "", "").Code; got != 401 {
		t.Fatalf("pins without the token: %d, want 401", got)
	}

	get := func(path string) (*httptest.ResponseRecorder, []policy.PinStatus) {
		t.Helper()
		r := httptest.NewRequest("GET", path, nil)
		r.Host = "127.0.0.1:9090"
		r.Header.Set("Authorization", "Bearer t0k")
		w := &lockProbe{ResponseRecorder: httptest.NewRecorder(), bal: bal, t: t}
		h.ServeHTTP(w, r)
		if w.Code != 200 || !w.probed {
			t.Fatalf("GET %s: %d (written: %v) %.200s", path, w.Code, w.probed, w.Body)
		}
		var list []policy.PinStatus
		if err := json.Unmarshal(w.Body.Bytes(), &list); err != nil {
			t.Fatal(err)
		}
		return w.ResponseRecorder, list
	}
	w, first := get("/admin/pins?limit=0")
	if len(first) != MaxPinsPage {
		t.Errorf("limit=0 gave %d pins, want the largest page %d", len(first), MaxPinsPage)
	}
	if size := w.Body.Len(); size > 4<<20 {
		t.Errorf("answer of %d bytes for one page", size)
	}
	t.Logf("1M pins: ?limit=0 answered %d pins in %d bytes, with a next cursor", len(first), w.Body.Len())
	cursor := w.Header().Get("X-LLMLB-Next-Cursor")
	if cursor == "" || !strings.Contains(w.Header().Get("Link"), `rel="next"`) {
		t.Fatalf("no next cursor: %v", w.Header())
	}
	_, second := get("/admin/pins?limit=500&cursor=" + url.QueryEscape(cursor))
	if len(second) != 500 {
		t.Fatalf("second page %d, want 500", len(second))
	}
	seen := map[string]bool{}
	for _, p := range first {
		seen[p.Key] = true
	}
	for _, p := range second {
		if seen[p.Key] {
			t.Fatalf("pin %s on both pages", p.Key)
		}
	}
	if w, _ := get("/admin/pins"); w.Header().Get("X-LLMLB-Next-Cursor") == "" {
		t.Errorf("default page has no cursor")
	}
	for _, bad := range []string{"cursor=!!", "cursor=AA", "limit=-1", "cursor=" + strings.Repeat("A", 600)} {
		r := httptest.NewRequest("GET", "/admin/pins?"+bad, nil)
		r.Host = "127.0.0.1:9090"
		r.Header.Set("Authorization", "Bearer t0k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != 400 {
			t.Errorf("%s: %d, want 400", bad, w.Code)
		}
	}
}

// A walk by cursor over a small table lists every pin exactly once.
func TestPinsCursorWalk(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Policy = policy.NameLLMLB // the policy that keeps pins
	h, bal := newAdminCfg(t, cfg, Options{}, "a")
	now := time.Now()
	for i := range 2345 {
		res, err := bal.Select(&balancer.Profile{Model: "m", SessionKey: fmt.Sprint("s", i), PrefixKey: fmt.Sprint("p", i%7)}, now)
		if err != nil {
			t.Fatal(err)
		}
		bal.Release(res, balancer.OutcomeOK, now)
	}
	seen := map[string]int{}
	path := "/admin/pins?limit=100"
	for pages := 0; ; pages++ {
		w := do(h, "GET", path, "", "")
		var list []policy.PinStatus
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &list) != nil {
			t.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
		for _, p := range list {
			seen[p.Kind+"/"+p.Key]++
		}
		c := w.Header().Get("X-LLMLB-Next-Cursor")
		if c == "" {
			break
		}
		path = "/admin/pins?limit=100&cursor=" + url.QueryEscape(c)
		if pages > 100 {
			t.Fatal("walk does not end")
		}
	}
	if len(seen) != 2345+7 {
		t.Errorf("walk saw %d pins, want %d", len(seen), 2345+7)
	}
	for k, c := range seen {
		if c != 1 {
			t.Errorf("%s seen %d times", k, c)
		}
	}
}

// TestPprofNeedsTheToken: profiling (BENCHMARKS.md, "Proxy efficiency vs NGINX") is served behind the admin
// token, and refused when no token is configured (unless opted in on loopback).
func TestPprofNeedsTheToken(t *testing.T) {
	withToken, _ := newAdmin(t, "s3cret", "a")
	noToken, _ := newAdminWith(t, Options{}, "a")
	optedIn, _ := newAdminWith(t, Options{AllowUnauthenticatedMutations: true}, "a")
	for _, c := range []struct {
		name string
		h    http.Handler
		path string
		auth string
		want int
	}{
		{"no token sent", withToken, "/debug/pprof/", "", http.StatusUnauthorized},
		{"wrong token", withToken, "/debug/pprof/", "Bearer nope", http.StatusUnauthorized},
		{"index with token", withToken, "/debug/pprof/", "Bearer s3cret", http.StatusOK},
		{"heap with token", withToken, "/debug/pprof/heap?debug=1", "Bearer s3cret", http.StatusOK},
		{"goroutines with token", withToken, "/debug/pprof/goroutine?debug=1", "Bearer s3cret", http.StatusOK},
		{"cmdline without token", withToken, "/debug/pprof/cmdline", "", http.StatusUnauthorized},
		{"no token configured", noToken, "/debug/pprof/", "", http.StatusForbidden},
		{"opted in on loopback", optedIn, "/debug/pprof/heap?debug=1", "", http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := do(c.h, http.MethodGet, c.path, c.auth, "")
			if rec.Code != c.want {
				t.Fatalf("GET %s: status %d, want %d: %s", c.path, rec.Code, c.want, rec.Body)
			}
			if c.want == http.StatusOK && !strings.Contains(rec.Body.String(), "goroutine") && !strings.Contains(rec.Body.String(), "heap") {
				t.Fatalf("GET %s: not a profile: %.200s", c.path, rec.Body)
			}
		})
	}
}
