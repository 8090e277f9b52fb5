// Package admin is the admin listener of `llmlb serve` (SPEC s10): replica,
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
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/proxy"
)

// Fleet performs the fleet mutations; the server implements it so that an
// added replica is also scraped and a removed one stops being scraped.
type Fleet interface {
	AddReplica(spec balancer.ReplicaSpec) error
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
	// Token guards the mutations when non-empty (Authorization: Bearer).
	Token string
	// PinsLimit bounds /admin/pins unless ?limit= is given (default 1000).
	PinsLimit int
	// Draining reports that the server is shutting down: /readyz then
	// answers 503 so load balancers in front stop sending. nil: never.
	Draining func() bool
	Logger   *slog.Logger
	Now      func() time.Time
}

// maxMutationBody bounds the body of POST /admin/replicas.
const maxMutationBody = 1 << 20

type handler struct {
	opts     Options
	tokenSum [sha256.Size]byte
	log      *slog.Logger
	now      func() time.Time
}

// NewHandler returns the admin listener's mux.
func NewHandler(opts Options) (http.Handler, error) {
	if opts.Balancer == nil {
		return nil, errors.New("admin: balancer is required")
	}
	if opts.PinsLimit <= 0 {
		opts.PinsLimit = 1000
	}
	h := &handler{opts: opts, log: opts.Logger, now: opts.Now}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.tokenSum = sha256.Sum256([]byte(opts.Token))

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
	// GET /ui is the dashboard's own issue; until it lands the mux answers 404.
	return mux, nil
}

func (h *handler) replicas(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, nonNil(h.opts.Balancer.Replicas(h.now())))
}

func (h *handler) pins(w http.ResponseWriter, r *http.Request) {
	limit := h.opts.PinsLimit
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "limit must be a non-negative integer (0 = all)")
			return
		}
		limit = n
	}
	writeJSON(w, http.StatusOK, nonNil(h.opts.Balancer.Pins(h.now(), limit)))
}

func (h *handler) alerts(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, nonNil(h.opts.Balancer.Alerts(h.now())))
}

func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz is 200 when at least one replica is LIVE (and not draining), 503
// otherwise and while the server drains.
func (h *handler) readyz(w http.ResponseWriter, _ *http.Request) {
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

// guard requires `Authorization: Bearer <token>` when a token is configured;
// the comparison is constant-time (on SHA-256 sums, so the length leaks
// nothing either).
func (h *handler) guard(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if h.opts.Token != "" {
			got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			sum := sha256.Sum256([]byte(got))
			if !ok || subtle.ConstantTimeCompare(sum[:], h.tokenSum[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="llmlb admin"`)
				writeError(w, http.StatusUnauthorized, "admin mutations need Authorization: Bearer <admin_token>")
				return
			}
		}
		if h.opts.Fleet == nil {
			writeError(w, http.StatusNotImplemented, "fleet mutations are not available")
			return
		}
		next(w, r)
	}
}

// addRequest is the body of POST /admin/replicas.
type addRequest struct {
	Name   string   `json:"name"`
	URL    string   `json:"url"`
	Models []string `json:"models"`
}

func (h *handler) addReplica(w http.ResponseWriter, r *http.Request) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMutationBody))
	dec.DisallowUnknownFields()
	var req addRequest
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad body (want {\"name\",\"url\",\"models\"}): %v", err))
		return
	}
	spec, err := specOf(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if h.find(spec.Name) != nil {
		writeError(w, http.StatusConflict, fmt.Sprintf("replica %q already exists", spec.Name))
		return
	}
	if err := h.opts.Fleet.AddReplica(spec); err != nil {
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

// specOf checks an add request; the name defaults to the URL's host:port.
func specOf(req addRequest) (balancer.ReplicaSpec, error) {
	u, err := url.Parse(req.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return balancer.ReplicaSpec{}, fmt.Errorf("admin: url %q must be an absolute http(s) URL", req.URL)
	}
	if _, _, err := net.SplitHostPort(u.Host); err != nil && !strings.Contains(err.Error(), "missing port") {
		return balancer.ReplicaSpec{}, fmt.Errorf("admin: url %q has a bad host: %w", req.URL, err)
	}
	name := req.Name
	if name == "" {
		name = u.Host
	}
	if strings.ContainsAny(name, "/ \t\n") {
		return balancer.ReplicaSpec{}, fmt.Errorf("admin: replica name %q must not contain '/' or spaces", name)
	}
	return balancer.ReplicaSpec{Name: name, URL: strings.TrimRight(req.URL, "/"), Models: req.Models}, nil
}

func (h *handler) removeReplica(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !h.opts.Fleet.RemoveReplica(name) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no replica %q", name))
		return
	}
	h.log.Info("admin: replica removed", slog.String("replica", name))
	writeJSON(w, http.StatusOK, map[string]string{"removed": name})
}

func (h *handler) drain(draining bool) http.HandlerFunc {
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

func (h *handler) find(name string) *balancer.ReplicaStatus {
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
	typ := proxy.TypeInvalidRequest
	if status >= 500 {
		typ = proxy.TypeServer
	}
	proxy.WriteError(w, status, typ, strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "_"), msg)
}
