package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
)

// healthPath is the proxy port's health check, where vLLM, SGLang and
// LiteLLM serve theirs: a load balancer or orchestrator in front of llmlb
// probes the port it sends traffic to.
const healthPath = "/health"

// withHealth answers GET (and HEAD) /health on the proxy port: 200 while at
// least one replica is LIVE and not draining, 503 otherwise and while the
// server drains, with a small JSON body. Health checks are not client
// requests: they bypass the proxy, its metrics and its access log.
type withHealth struct {
	next     http.Handler
	bal      *balancer.Balancer
	now      func() time.Time
	draining *atomic.Bool
}

// healthBody is /health's answer.
type healthBody struct {
	Status       string `json:"status"` // "ok" | "no live replica" | "draining"
	LiveReplicas int    `json:"live_replicas"`
	Replicas     int    `json:"replicas"`
}

func (h *withHealth) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != healthPath || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
		h.next.ServeHTTP(w, r)
		return
	}
	h.answer(w, r)
}

// answer is /health's answer: a function of its own so that its locals
// are not on the stack of every proxied request (observed.record).
func (h *withHealth) answer(w http.ResponseWriter, r *http.Request) {
	reps := h.bal.Replicas(h.now())
	body := healthBody{Status: "ok", Replicas: len(reps)}
	for _, rep := range reps {
		if rep.State == "LIVE" && !rep.Draining {
			body.LiveReplicas++
		}
	}
	code := http.StatusOK
	switch {
	case h.draining != nil && h.draining.Load():
		body.Status, code = "draining", http.StatusServiceUnavailable
	case body.LiveReplicas == 0:
		body.Status, code = "no live replica", http.StatusServiceUnavailable
	}
	out, _ := json.Marshal(body) // a struct of a string and ints: never fails
	out = append(out, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if r.Method != http.MethodHead {
		_, _ = w.Write(out)
	}
}
