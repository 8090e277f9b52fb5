package balancer

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/policy"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newFleet returns a balancer routing with policy llmlb (whose pin rules
// most tests here state) with replicas a, b, c, ... (n of them), each
// scraped idle and LIVE at t0.
func newFleet(t testing.TB, n int, mutate func(*Config)) *Balancer {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Policy = policy.NameLLMLB
	if mutate != nil {
		mutate(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		name := string(rune('a' + i))
		if err := b.AddReplica(ReplicaSpec{Name: name, URL: "http://" + name}, t0); err != nil {
			t.Fatal(err)
		}
		b.ObserveScrape(name, Snapshot{}, nil, t0)
	}
	return b
}

// ev is one step of a scenario, at t0+at.
//
//	scrape  r run wait   a successful scrape of r with that load
//	fail    r            a failed scrape of r
//	probe   r            r's two good scrapes after its cooldown: EJECTED -> PROBING
//	select  sess pfx     a request (tokens: prompt tokens, default 0 = weight 1);
//	                     it stays in flight unless release is set
//	5xx     r            a request answered 5xx by r (select+release)
//	tick                 Tick
//	drain   r            SetDraining(r, true)
//	pinned  sess|pfx     checks the key's pin is on want ("" = no pin)
//
// want/reason/pin check a select: the replica ("err:<text>" for an error,
// "any" for no check), the reason and a substring of the pin decision.
// state checks r's state after the step.
type ev struct {
	at        time.Duration
	op        string
	r         string
	run, wait float64
	sess, pfx string
	tokens    int
	release   bool
	want      string
	reason    Reason
	pin       string
	state     string
}

// play runs the steps on b and checks their expectations.
func play(t *testing.T, b *Balancer, steps []ev) {
	t.Helper()
	for i, s := range steps {
		now := t0.Add(s.at)
		where := fmt.Sprintf("step %d (%s %s at +%s)", i, s.op, s.r, s.at)
		switch s.op {
		case "scrape":
			b.ObserveScrape(s.r, Snapshot{Running: s.run, Waiting: s.wait}, nil, now)
		case "fail":
			b.ObserveScrape(s.r, Snapshot{}, errors.New("connection refused"), now)
		case "alive": // a good scrape inside the cooldown: EJECTED but answering
			b.ObserveScrape(s.r, Snapshot{}, nil, now)
		case "probe":
			cd := time.Duration(statusOf(t, b, s.r, now).CooldownSeconds * float64(time.Second))
			b.ObserveScrape(s.r, Snapshot{}, nil, now.Add(cd))
			b.ObserveScrape(s.r, Snapshot{}, nil, now.Add(cd+3*time.Second))
		case "tick":
			b.Tick(now)
		case "drain":
			b.SetDraining(s.r, true)
		case "pinned":
			kind, key := "session", s.sess
			if key == "" {
				kind, key = "prefix", s.pfx
			}
			if got := pinOf(b, kind, key, now); got != s.want {
				t.Fatalf("%s: %s %s pinned to %q, want %q", where, kind, key, got, s.want)
			}
		case "5xx", "4xx": // a proxied request answered with that status
			res, err := b.Select(&Profile{}, now)
			if err != nil || res.Replica != s.r {
				t.Fatalf("%s: %s request went to %v (%v), want %s", where, s.op, res, err, s.r)
			}
			o := OutcomeServerError
			if s.op == "4xx" {
				o = OutcomeRejected
			}
			b.Release(res, o, now)
		case "select":
			res, err := b.Select(&Profile{SessionKey: s.sess, PrefixKey: s.pfx, PromptTokens: s.tokens}, now)
			if strings.HasPrefix(s.want, "err:") {
				if err == nil || !strings.Contains(err.Error(), s.want[4:]) {
					t.Fatalf("%s: error %v, want %q", where, err, s.want[4:])
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if s.want != "any" && res.Replica != s.want {
				t.Fatalf("%s: routed to %s (%+v), want %s", where, res.Replica, res.Explanation, s.want)
			}
			if s.reason != "" && res.Reason != s.reason {
				t.Fatalf("%s: reason %s, want %s (%+v)", where, res.Reason, s.reason, res.Explanation)
			}
			if s.pin != "" && !strings.Contains(res.Explanation.PinKind+" "+res.Explanation.PinDecision, s.pin) {
				t.Fatalf("%s: pin %q %q, want %q", where, res.Explanation.PinKind, res.Explanation.PinDecision, s.pin)
			}
			if s.release {
				b.Release(res, OutcomeOK, now)
			}
		default:
			t.Fatalf("%s: unknown op", where)
		}
		if s.state != "" {
			if got := statusOf(t, b, s.r, now).State; got != s.state {
				t.Fatalf("%s: %s is %s, want %s", where, s.r, got, s.state)
			}
		}
	}
}

func statusOf(t testing.TB, b *Balancer, name string, now time.Time) ReplicaStatus {
	t.Helper()
	for _, r := range b.Replicas(now) {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no replica %s", name)
	return ReplicaStatus{}
}

// pinOf returns the replica a key is pinned to ("" = none).
func pinOf(b *Balancer, kind, key string, now time.Time) string {
	for _, p := range pinsOf(b, now) {
		if p.Kind == kind && p.Key == key {
			return p.Replica
		}
	}
	return ""
}

// pinsOf copies the policy's pins (none when it keeps none).
func pinsOf(b *Balancer, now time.Time) []policy.PinStatus {
	var out []policy.PinStatus
	b.Inspect(func(p policy.Policy) {
		if t, ok := p.(policy.PinTable); ok {
			out = t.PinList(now, 0)
		}
	})
	return out
}

// pinCount returns the policy's number of pins, session and prefix.
func pinCount(b *Balancer) int {
	n := 0
	b.Inspect(func(p policy.Policy) {
		if t, ok := p.(policy.PinTable); ok {
			s, pr := t.PinCounts()
			n = s + pr
		}
	})
	return n
}

// selectN routes n requests with an empty profile at now and returns their
// reservations, failing the test on any error.
func selectN(t testing.TB, b *Balancer, n int, now time.Time) []*Reservation {
	t.Helper()
	held := make([]*Reservation, 0, n)
	for range n {
		res, err := b.Select(&Profile{}, now)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	return held
}
