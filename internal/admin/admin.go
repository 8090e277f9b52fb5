// Package admin is the admin listener of `llmlb serve`: replica,
// pin and alert state as JSON, llmlb's own Prometheus metrics, liveness and
// readiness, and the fleet mutations (add, remove, drain) behind an optional
// bearer token.
package admin

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/kvevents"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/replicaurl"
)

// Fleet performs the fleet mutations; the server implements it so that an
// added replica is also scraped and a removed one stops being scraped.
type Fleet interface {
	AddReplica(spec balancer.ReplicaSpec, ev KVEvents) error
	RemoveReplica(name string) bool
	SetDraining(name string, draining bool) bool
}

// Options configures the admin handler. Balancer is required.
type Options struct {
	Balancer *balancer.Balancer
	// Fleet performs mutations; nil makes them answer 501.
	Fleet Fleet
	// Metrics is served on /metrics; nil serves 404 there.
	Metrics *Metrics
	// Token guards the mutations and /admin/pins when non-empty
	// (Authorization: Bearer). Without it mutations are refused unless
	// AllowUnauthenticatedMutations is set and Listen is a loopback address.
	Token string
	// Listen is the admin listener's address (admin_listen). Its host is an
	// allowed Host name, and only a loopback Listen lets
	// AllowUnauthenticatedMutations open the mutations.
	Listen string
	// AllowedHosts are the Host header names, besides IP literals,
	// "localhost" and Listen's host, that the admin listener answers
	// (admin.allowed_hosts; "*" = any). Other names are refused: a DNS
	// rebinding page carries its own name in Host.
	AllowedHosts []string
	// AllowUnauthenticatedMutations opens the mutations without a token
	// (admin.allow_unauthenticated_mutations); honoured only on loopback.
	AllowUnauthenticatedMutations bool
	// PinsLimit is the page size of /admin/pins unless ?limit= is given
	// (default 1000, at most MaxPinsPage).
	PinsLimit int
	// Draining reports that the server is shutting down: /readyz then
	// answers 503 so load balancers in front stop sending. nil: never.
	Draining func() bool
	Logger   *slog.Logger
	Now      func() time.Time
}

// Access is the part of Options that a configuration reload may change
// (SIGHUP): see Handler.SetAccess.
type Access struct {
	Token                         string
	AllowedHosts                  []string
	AllowUnauthenticatedMutations bool
}

// maxMutationBody bounds the body of POST /admin/replicas.
const maxMutationBody = 1 << 20

// access is the compiled Access the handler checks each request against.
type access struct {
	token        string
	tokenSum     [sha256.Size]byte
	anyHost      bool
	hosts        map[string]bool // lower-case names without port
	openMutation bool            // no token, opted in, loopback listener
}

// Handler is the admin listener's handler. Its access rules (token, allowed
// hosts, the unauthenticated opt-in) can be replaced at run time.
type Handler struct {
	opts     Options
	mux      *http.ServeMux
	acc      atomic.Pointer[access]
	cop      *http.CrossOriginProtection
	loopback bool
	log      *slog.Logger
	now      func() time.Time
}

// NewHandler returns the admin listener's handler.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Balancer == nil {
		return nil, errors.New("admin: balancer is required")
	}
	if opts.PinsLimit <= 0 {
		opts.PinsLimit = defaultPinsPage
	}
	opts.PinsLimit = min(opts.PinsLimit, MaxPinsPage)
	h := &Handler{opts: opts, log: opts.Logger, now: opts.Now, cop: http.NewCrossOriginProtection(),
		loopback: replicaurl.IsLoopback(opts.Listen)}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.SetAccess(Access{Token: opts.Token, AllowedHosts: opts.AllowedHosts,
		AllowUnauthenticatedMutations: opts.AllowUnauthenticatedMutations})

	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin/replicas", h.replicas)
	mux.HandleFunc("GET /admin/pins", h.pins)
	mux.HandleFunc("GET /admin/alerts", h.alerts)
	mux.HandleFunc("GET /healthz", h.healthz)
	mux.HandleFunc("GET /readyz", h.readyz)
	mux.HandleFunc("POST /admin/replicas", h.guard(h.addReplica))
	mux.HandleFunc("DELETE /admin/replicas/{name}", h.guard(h.removeReplica))
	mux.HandleFunc("POST /admin/replicas/{name}/drain", h.guard(h.drain(true)))
	mux.HandleFunc("POST /admin/replicas/{name}/undrain", h.guard(h.drain(false)))
	if opts.Metrics != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Metrics.Registry(), promhttp.HandlerOpts{}))
	}
	// Profiling for operators (BENCHMARKS.md, "Proxy efficiency vs NGINX"), behind the token like the mutations.
	mux.HandleFunc("GET /debug/pprof/", h.debug(pprof.Index))
	mux.HandleFunc("GET /debug/pprof/cmdline", h.debug(pprof.Cmdline))
	mux.HandleFunc("GET /debug/pprof/profile", h.debug(pprof.Profile))
	mux.HandleFunc("GET /debug/pprof/symbol", h.debug(pprof.Symbol))
	mux.HandleFunc("POST /debug/pprof/symbol", h.debug(pprof.Symbol))
	mux.HandleFunc("GET /debug/pprof/trace", h.debug(pprof.Trace))
	// The dashboard (GET /ui, GET /admin/events) mounts beside these with Handle.
	h.mux = mux
	return h, nil
}

// SetAccess replaces the token, the allowed hosts and the unauthenticated
// opt-in, for the next request on (a SIGHUP that adds admin_token takes
// effect at once; docs/SECURITY.md).
func (h *Handler) SetAccess(a Access) {
	acc := &access{token: a.Token, tokenSum: sha256.Sum256([]byte(a.Token)), hosts: map[string]bool{"localhost": true}}
	if host := listenHost(h.opts.Listen); host != "" {
		acc.hosts[host] = true
	}
	for _, name := range a.AllowedHosts {
		if name == "*" {
			acc.anyHost = true
		}
		acc.hosts[hostOnly(name)] = true
	}
	acc.openMutation = a.Token == "" && a.AllowUnauthenticatedMutations && h.loopback
	h.acc.Store(acc)
}

// anyHostPaths answer whatever the Host header says: monitoring (probes and
// Prometheus, often pointed at a service name) reads no session id, no URL
// and changes nothing, so a rebinding page gains nothing there.
var anyHostPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// ServeHTTP checks the Host header of every request but monitoring's
// (anyHostPaths) against the allowed names (DNS rebinding), then serves.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !anyHostPaths[r.URL.Path] && !h.hostAllowed(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf(
			"admin: Host %q is not an address of this admin listener; add the name to admin.allowed_hosts", r.Host))
		return
	}
	h.mux.ServeHTTP(w, r)
}

// Handle serves another route beside the API (the dashboard) behind the same
// Host check; the handler does its own authorization.
func (h *Handler) Handle(pattern string, handler http.Handler) { h.mux.Handle(pattern, handler) }

// hostAllowed reports whether a Host header may reach the admin API: an IP
// literal (a rebinding page's Host is always its own DNS name), localhost,
// the listen address's host, or a configured name.
func (h *Handler) hostAllowed(hostport string) bool {
	acc := h.acc.Load()
	if acc.anyHost || hostport == "" {
		return true
	}
	host := hostOnly(hostport)
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return acc.hosts[host]
}

// hostOnly returns a Host header's name, lower-case, without port, brackets
// or a trailing dot.
func hostOnly(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return strings.ToLower(host)
}

// listenHost is the host of a listen address ("" for ":9090").
func listenHost(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return ""
	}
	return hostOnly(host)
}

func (h *Handler) replicas(w http.ResponseWriter, _ *http.Request) {
	list := h.opts.Balancer.Replicas(h.now())
	for i := range list {
		list[i].URL = safeURL(list[i].URL)
	}
	writeJSON(w, http.StatusOK, nonNil(list))
}

// safeURL drops credentials from a URL before it is shown: validation
// refuses them, this is defence in depth (docs/SECURITY.md).
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL>"
	}
	if u.User == nil {
		return raw
	}
	u.User = nil
	return u.String()
}

func (h *Handler) alerts(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, nonNil(h.opts.Balancer.Alerts(h.now())))
}

func (h *Handler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is 200 when at least one replica is LIVE (and not draining), 503
// otherwise and while the server drains.
func (h *Handler) readyz(w http.ResponseWriter, _ *http.Request) {
	if h.opts.Draining != nil && h.opts.Draining() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "draining"})
		return
	}
	live := 0
	for _, r := range h.opts.Balancer.Replicas(h.now()) {
		if r.State == "LIVE" && !r.Draining {
			live++
		}
	}
	if live == 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not ready", "live_replicas": 0})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "live_replicas": live})
}

// authorized reports whether r carries the configured token (false when
// none is configured). The comparison is constant-time, on SHA-256 sums so
// that the length leaks nothing either.
func (acc *access) authorized(r *http.Request) bool {
	if acc.token == "" {
		return false
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(got))
	return ok && subtle.ConstantTimeCompare(sum[:], acc.tokenSum[:]) == 1
}

func unauthorized(w http.ResponseWriter, what string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="llmlb admin"`)
	writeError(w, http.StatusUnauthorized, what+" need Authorization: Bearer <admin_token>")
}

// guard admits a mutation only if it is not a cross-site browser request
// (Sec-Fetch-Site / Origin against Host) and is authorized: the token when
// one is configured; without one, only when the operator opted in with
// admin.allow_unauthenticated_mutations on a loopback listener.
func (h *Handler) guard(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := h.cop.Check(r); err != nil {
			writeError(w, http.StatusForbidden, "admin: cross-origin request refused (Origin "+strconv.Quote(r.Header.Get("Origin"))+
				" is not this admin listener); send mutations from curl or scripts, not from web pages")
			return
		}
		if !h.admitted(w, r, "admin mutations", "mutations are") {
			return
		}
		if h.opts.Fleet == nil {
			writeError(w, http.StatusNotImplemented, "fleet mutations are not available")
			return
		}
		next(w, r)
	}
}

// admitted applies the rule of mutations and profiles: the admin token when
// one is configured; without one, only with allow_unauthenticated_mutations
// (loopback). Otherwise it answers 401 or 403 naming what (realm in the
// 401's challenge, subject in the 403's message) and returns false.
func (h *Handler) admitted(w http.ResponseWriter, r *http.Request, realm, subject string) bool {
	acc := h.acc.Load()
	switch {
	case acc.token != "":
		if !acc.authorized(r) {
			unauthorized(w, realm)
			return false
		}
	case !acc.openMutation:
		writeError(w, http.StatusForbidden, "admin: "+subject+" disabled without admin_token; set admin_token "+
			"(or admin.allow_unauthenticated_mutations: true with admin_listen on loopback)")
		return false
	}
	return true
}

// debug admits a request to /debug/pprof/ under the mutations' rule: the
// token when one is configured; without one, only with
// admin.allow_unauthenticated_mutations on a loopback listener. A profile
// shows the command line and costs CPU, so it is never open by default.
func (h *Handler) debug(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.admitted(w, r, "/debug/pprof/", "/debug/pprof/ is") {
			return
		}
		next(w, r)
	}
}

// KVEvents is where an added replica publishes its KV cache events
// (docs/KV_EVENTS.md); the zero value: it does not.
type KVEvents struct {
	Endpoint string // its PUB socket, tcp://host:port
	Replay   string // its replay socket, tcp://host:port; "" none
}

// addRequest is the body of POST /admin/replicas.
type addRequest struct {
	Name           string   `json:"name"`
	URL            string   `json:"url"`
	Models         []string `json:"models"`
	KVEvents       string   `json:"kv_events"`
	KVEventsReplay string   `json:"kv_events_replay"`
}

func (h *Handler) addReplica(w http.ResponseWriter, r *http.Request) {
	// A CORS-simple request (text/plain, form) never reaches the body: a
	// browser can send those cross-site without a preflight.
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "admin: POST /admin/replicas needs Content-Type: application/json")
		return
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMutationBody))
	dec.DisallowUnknownFields()
	var req addRequest
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad body (want {\"name\",\"url\",\"models\",\"kv_events\",\"kv_events_replay\"}): %v", err))
		return
	}
	spec, err := specOf(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	ev, err := kvEventsOf(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if h.find(spec.Name) != nil {
		writeError(w, http.StatusConflict, fmt.Sprintf("replica %q already exists", spec.Name))
		return
	}
	key := replicaurl.Key(spec.URL)
	for _, other := range h.opts.Balancer.Replicas(h.now()) {
		if replicaurl.Key(other.URL) == key {
			writeError(w, http.StatusConflict, fmt.Sprintf("url %q is already replica %q; list each server once", spec.URL, other.Name))
			return
		}
	}
	if err := h.opts.Fleet.AddReplica(spec, ev); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	h.log.Info("admin: replica added", slog.String("replica", spec.Name), slog.String("url", spec.URL))
	if st := h.find(spec.Name); st != nil {
		writeJSON(w, http.StatusCreated, st)
		return
	}
	writeJSON(w, http.StatusCreated, spec)
}

// specOf checks an add request with the configuration's rules (a strict
// name charset, a root http(s) URL without credentials, query or fragment);
// the name defaults to the URL's host:port.
func specOf(req addRequest) (balancer.ReplicaSpec, error) {
	if problems := replicaurl.Check(req.URL); len(problems) > 0 {
		return balancer.ReplicaSpec{}, fmt.Errorf("admin: url: %s", strings.Join(problems, "; "))
	}
	name := req.Name
	if name == "" {
		u, _ := url.Parse(req.URL)
		name = u.Host
	}
	if err := replicaurl.CheckName(name); err != nil {
		return balancer.ReplicaSpec{}, fmt.Errorf("admin: name: %w", err)
	}
	for i, m := range req.Models {
		if strings.TrimSpace(m) == "" || !utf8.ValidString(m) || len(m) > 1024 {
			return balancer.ReplicaSpec{}, fmt.Errorf("admin: models[%d]: empty, too long or not UTF-8", i)
		}
	}
	return balancer.ReplicaSpec{Name: name, URL: strings.TrimRight(req.URL, "/"), Models: req.Models}, nil
}

// kvEventsOf checks an add request's KV event endpoints as the
// configuration does: tcp://host:port each, a replay socket only beside a
// publisher.
func kvEventsOf(req addRequest) (KVEvents, error) {
	ev := KVEvents{Endpoint: req.KVEvents, Replay: req.KVEventsReplay}
	if ev.Endpoint != "" {
		if err := kvevents.ValidateEndpoint(ev.Endpoint); err != nil {
			return KVEvents{}, fmt.Errorf("admin: kv_events: %w", err)
		}
	}
	if ev.Replay != "" {
		if ev.Endpoint == "" {
			return KVEvents{}, errors.New("admin: kv_events_replay: needs kv_events")
		}
		if err := kvevents.ValidateEndpoint(ev.Replay); err != nil {
			return KVEvents{}, fmt.Errorf("admin: kv_events_replay: %w", err)
		}
	}
	return ev, nil
}

func (h *Handler) removeReplica(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !h.opts.Fleet.RemoveReplica(name) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no replica %q", name))
		return
	}
	h.log.Info("admin: replica removed", slog.String("replica", name))
	writeJSON(w, http.StatusOK, map[string]string{"removed": name})
}

func (h *Handler) drain(draining bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		if !h.opts.Fleet.SetDraining(name, draining) {
			writeError(w, http.StatusNotFound, fmt.Sprintf("no replica %q", name))
			return
		}
		h.log.Info("admin: replica draining changed", slog.String("replica", name), slog.Bool("draining", draining))
		if st := h.find(name); st != nil {
			writeJSON(w, http.StatusOK, st)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "draining": draining})
	}
}

func (h *Handler) find(name string) *balancer.ReplicaStatus {
	for _, r := range h.opts.Balancer.Replicas(h.now()) {
		if r.Name == name {
			return &r
		}
	}
	return nil
}

// nonNil makes an empty list encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encoding the answer failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeError answers in the same OpenAI error shape as the proxy.
func writeError(w http.ResponseWriter, status int, msg string) {
	openai.WriteStatusError(w, status, msg)
}
