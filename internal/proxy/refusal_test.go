package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/health"
)

// refusingUpstream answers every request with status, a Retry-After and an
// OpenAI-shaped error body, and counts the requests.
func refusingUpstream(t *testing.T, status int, calls *atomic.Int32) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(status)
		io.WriteString(w, `{"error":{"message":"busy, try later","code":`+http.StatusText(status)[:3]+`}}`)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestRefusalIsTriedElsewhere: a replica that answers 429, 502 or 503 has
// computed nothing, so the request goes to another replica and the client
// never sees the refusal. A 429 says nothing against the replica's health.
func TestRefusalIsTriedElsewhere(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			var calls atomic.Int32
			busy := refusingUpstream(t, status, &calls)
			f := newFixture(t, defaultProxyConfig(), replica{name: "busy", url: busy.URL}, replica{name: "ok", url: okUpstream(t).URL})
			for i := range 2 { // both idle: rotation tries "busy" first once
				w := post(t, f.p, chatBody, nil)
				if w.Code != http.StatusOK || w.Header().Get(HeaderReplica) != "ok" {
					t.Fatalf("request %d: %d from %q, body %s; want 200 from ok", i, w.Code, w.Header().Get(HeaderReplica), w.Body)
				}
			}
			if calls.Load() == 0 {
				t.Fatal("the refusing replica was never tried")
			}
			if got := len(f.rec.failovers); got != int(calls.Load()) {
				t.Errorf("%d failovers counted for %d refusals", got, calls.Load())
			}
			if n := f.inFlight(t); n != 0 {
				t.Errorf("in-flight %d, want 0", n)
			}
			if status == http.StatusTooManyRequests {
				for _, r := range f.bal.Replicas(time.Now()) {
					if r.State != health.Live.String() {
						t.Errorf("replica %s is %s after a 429, want LIVE", r.Name, r.State)
					}
				}
			}
		})
	}
}

// TestRefusalReachesTheClientWhenNoneIsLeft: with no other replica to try,
// or every attempt refused, the client gets the last replica's own answer:
// its status, Retry-After and body.
func TestRefusalReachesTheClientWhenNoneIsLeft(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		var calls atomic.Int32
		var reps []replica
		for i := range n {
			reps = append(reps, replica{name: string(rune('a' + i)), url: refusingUpstream(t, http.StatusTooManyRequests, &calls).URL})
		}
		f := newFixture(t, defaultProxyConfig(), reps...)
		w := post(t, f.p, chatBody, nil)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "7" || !strings.Contains(w.Body.String(), "busy, try later") {
			t.Fatalf("%d replicas: got %d, Retry-After %q, body %q; want the replica's 429", n, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		if got := w.Header().Get(HeaderReplica); got == "" {
			t.Errorf("%d replicas: no %s on the refusal", n, HeaderReplica)
		}
		if got := w.Header().Get("Content-Length"); got != strconv.Itoa(w.Body.Len()) {
			t.Errorf("%d replicas: Content-Length %q for a body of %d bytes", n, got, w.Body.Len())
		}
		if got, want := int(calls.Load()), min(n, 3); got != want {
			t.Errorf("%d replicas: %d tried, want %d (each once, at most max_attempts)", n, got, want)
		}
		if n := f.inFlight(t); n != 0 {
			t.Errorf("in-flight %d, want 0", n)
		}
		// Busy is not broken: a replica answering 429 to everything is
		// never ejected for it.
		for range 4 {
			if w := post(t, f.p, chatBody, nil); w.Code != http.StatusTooManyRequests {
				t.Fatalf("%d replicas: a later request got %d, want the replicas' 429", n, w.Code)
			}
		}
		for _, r := range f.bal.Replicas(time.Now()) {
			if r.State != health.Live.String() {
				t.Errorf("replica %s is %s after answering 429s, want LIVE", r.Name, r.State)
			}
		}
	}
}

// TestRetryStatusesAreConfigurable: an empty proxy.retry_statuses passes a
// 429 straight to the client; a list with 500 tries a 500 elsewhere.
func TestRetryStatusesAreConfigurable(t *testing.T) {
	var calls atomic.Int32
	cfg := defaultProxyConfig()
	cfg.RetryStatuses = []int{}
	f := newFixture(t, cfg, replica{name: "busy", url: refusingUpstream(t, http.StatusTooManyRequests, &calls).URL},
		replica{name: "ok", url: okUpstream(t).URL})
	for range 2 {
		if w := post(t, f.p, chatBody, nil); w.Code == http.StatusTooManyRequests {
			break
		}
	}
	if calls.Load() != 1 || len(f.rec.failovers) != 0 {
		t.Fatalf("with no retry statuses: busy called %d times, %d failovers; want its 429 passed through once", calls.Load(), len(f.rec.failovers))
	}

	calls.Store(0)
	cfg.RetryStatuses = []int{http.StatusInternalServerError}
	f = newFixture(t, cfg, replica{name: "broken", url: refusingUpstream(t, http.StatusInternalServerError, &calls).URL},
		replica{name: "ok", url: okUpstream(t).URL})
	for i := range 2 {
		if w := post(t, f.p, chatBody, nil); w.Code != http.StatusOK {
			t.Fatalf("request %d with 500 retried: got %d", i, w.Code)
		}
	}
	if calls.Load() == 0 {
		t.Fatal("the broken replica was never tried")
	}
}

// TestReplicaRejectingItsKeyFailsOver: a replica that answers 401 to the api
// key configured for it is misconfigured (a key rotated on one replica, say):
// the request goes to another replica, the client never sees a 401 for its
// own key, and the replica is ejected like any failing one. Without a key of
// its own the replica judged the client's key: its 401 goes to the client.
func TestReplicaRejectingItsKeyFailsOver(t *testing.T) {
	var calls atomic.Int32
	badKey := refusingUpstream(t, http.StatusUnauthorized, &calls)
	f := newFixture(t, defaultProxyConfig(), replica{name: "rotated", url: badKey.URL, key: "sk-old"},
		replica{name: "ok", url: okUpstream(t).URL, key: "sk-ok"})
	for i := range 8 {
		w := post(t, f.p, chatBody, nil)
		if w.Code != http.StatusOK || w.Header().Get(HeaderReplica) != "ok" {
			t.Fatalf("request %d: %d from %q, want 200 from ok", i, w.Code, w.Header().Get(HeaderReplica))
		}
	}
	if calls.Load() == 0 {
		t.Fatal("the replica with the rotated key was never tried")
	}
	for _, r := range f.bal.Replicas(time.Now()) {
		if r.Name == "rotated" && r.State != health.Ejected.String() {
			t.Errorf("after %d rejections of its key the replica is %s, want EJECTED (3 failures in a row eject)", calls.Load(), r.State)
		}
	}

	// The client's own key, judged by a replica llmlb holds no key for.
	calls.Store(0)
	f = newFixture(t, defaultProxyConfig(), replica{name: "strict", url: refusingUpstream(t, http.StatusUnauthorized, &calls).URL})
	w := post(t, f.p, chatBody, map[string]string{"Authorization": "Bearer sk-wrong"})
	if w.Code != http.StatusUnauthorized || calls.Load() != 1 {
		t.Fatalf("client's bad key: %d after %d calls, want the replica's 401 after 1", w.Code, calls.Load())
	}
	if st := f.bal.Replicas(time.Now())[0].State; st != health.Live.String() {
		t.Errorf("a replica refusing a client's key is %s, want LIVE", st)
	}
}

// TestUnavailableReplicaIsEjectedWhileRetried: a 503 is tried elsewhere,
// and it still counts as the replica's failure (docs/ROUTING.md, "Health"): three in a row
// eject it, as before the retry.
func TestUnavailableReplicaIsEjectedWhileRetried(t *testing.T) {
	var calls atomic.Int32
	f := newFixture(t, defaultProxyConfig(), replica{name: "down", url: refusingUpstream(t, http.StatusServiceUnavailable, &calls).URL},
		replica{name: "ok", url: okUpstream(t).URL})
	for i := range 10 {
		if w := post(t, f.p, chatBody, nil); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d, want 200 from ok", i, w.Code)
		}
	}
	if calls.Load() < 3 {
		t.Fatalf("the unavailable replica was tried %d times; the test needs 3", calls.Load())
	}
	for _, r := range f.bal.Replicas(time.Now()) {
		if r.Name == "down" && r.State != health.Ejected.String() {
			t.Errorf("after %d 503s in a row the replica is %s, want EJECTED", calls.Load(), r.State)
		}
	}
}
