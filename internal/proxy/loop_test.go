package proxy

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
)

// A replica URL that is llmlb's own listener turned one request into about
// 9,900 self-hops. Forwarded requests carry the instance's mark; a request
// that comes back with it is refused with 508, and the replica that sent it
// back is ejected.
func TestSelfLoopIsRefused(t *testing.T) {
	tests := []struct {
		name       string
		withGood   bool
		wantStatus int
	}{
		{"the only replica loops: 508", false, http.StatusLoopDetected},
		{"another replica serves it", true, http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var reps []replica
			if tc.withGood {
				reps = append(reps, replica{name: "good", url: okUpstream(t).URL})
			}
			f := newFixture(t, defaultProxyConfig(), reps...)
			// The front counts the requests that reach the proxy and stops
			// a runaway loop (on the code before the fix) after 50 hops.
			var hops atomic.Int64
			front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if hops.Add(1) > 50 {
					http.Error(w, "runaway loop", http.StatusInternalServerError)
					return
				}
				f.p.ServeHTTP(w, r)
			}))
			t.Cleanup(front.Close)
			if err := f.bal.AddReplica(balancer.ReplicaSpec{Name: "self", URL: front.URL, Models: []string{"m"}}, time.Now()); err != nil {
				t.Fatal(err)
			}
			// Send until the loop has been seen (the balancer may pick
			// "good" first).
			for i := 0; i < 20 && f.state("self").State != "EJECTED"; i++ {
				hops.Store(0)
				status, body, err := postTo(front.URL, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
				if err != nil {
					t.Fatal(err)
				}
				if h := hops.Load(); h > 2 {
					t.Fatalf("one request made %d hops through the proxy, want at most 2", h)
				}
				if status != tc.wantStatus {
					t.Fatalf("status %d (%s), want %d", status, body, tc.wantStatus)
				}
				if status == http.StatusLoopDetected {
					if code := errorCode(t, []byte(body)); code != openai.CodeLoopDetected {
						t.Errorf("error code %q, want %q", code, openai.CodeLoopDetected)
					}
				}
			}
			if got := f.state("self").State; got != "EJECTED" {
				t.Errorf("self-loop replica is %s, want EJECTED", got)
			}
		})
	}
}
