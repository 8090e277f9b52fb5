package health

import (
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// step is one event fed to the machine at t0+at.
type step struct {
	at   time.Duration
	do   string // "scrape-ok" | "scrape-fail" | "req-ok" | "req-fail" | "tick"
	want State  // state after the event
}

func (s step) apply(m *Machine) []Transition {
	now := t0.Add(s.at)
	switch s.do {
	case "scrape-ok":
		return m.ObserveScrape(true, "", now)
	case "scrape-fail":
		return m.ObserveScrape(false, "connection refused", now)
	case "req-ok":
		return m.ObserveRequest(true, "", now)
	case "req-fail":
		return m.ObserveRequest(false, "502", now)
	default:
		return m.Tick(now)
	}
}

// TestMachine has one case per health rule of docs/ROUTING.md "Health".
func TestMachine(t *testing.T) {
	s := time.Second
	tests := []struct {
		name  string
		steps []step
	}{
		{"replicas start LIVE and stay LIVE on good scrapes", []step{
			{0, "scrape-ok", Live}, {3 * s, "scrape-ok", Live},
		}},
		{"one failed scrape ejects", []step{
			{0, "scrape-fail", Ejected},
		}},
		{"3 consecutive failed requests eject, not 2", []step{
			{0, "req-fail", Live}, {1 * s, "req-fail", Live}, {2 * s, "req-fail", Ejected},
		}},
		{"a good request resets the failure count", []step{
			{0, "req-fail", Live}, {1 * s, "req-fail", Live}, {2 * s, "req-ok", Live},
			{3 * s, "req-fail", Live}, {4 * s, "req-fail", Live},
		}},
		{"good scrapes during the cooldown do not count", []step{
			{0, "scrape-fail", Ejected}, {3 * s, "scrape-ok", Ejected}, {27 * s, "scrape-ok", Ejected},
			{30 * s, "scrape-ok", Ejected}, {33 * s, "scrape-ok", Probing},
		}},
		{"a failed scrape restarts the count of good ones", []step{
			{0, "scrape-fail", Ejected}, {30 * s, "scrape-ok", Ejected}, {33 * s, "scrape-fail", Ejected},
			{36 * s, "scrape-ok", Ejected}, {39 * s, "scrape-ok", Probing},
		}},
		{"a user request never brings a replica back", []step{
			{0, "scrape-fail", Ejected}, {40 * s, "req-ok", Ejected}, {50 * s, "req-ok", Ejected},
		}},
		{"PROBING -> LIVE after a clean 15 s window (tick)", []step{
			{0, "scrape-fail", Ejected}, {30 * s, "scrape-ok", Ejected}, {33 * s, "scrape-ok", Probing},
			{47 * s, "tick", Probing}, {48 * s, "tick", Live},
		}},
		{"PROBING -> LIVE by the next scrape after the window", []step{
			{0, "scrape-fail", Ejected}, {30 * s, "scrape-ok", Ejected}, {33 * s, "scrape-ok", Probing},
			{48 * s, "scrape-ok", Live},
		}},
		{"a failed scrape while PROBING ejects", []step{
			{0, "scrape-fail", Ejected}, {30 * s, "scrape-ok", Ejected}, {33 * s, "scrape-ok", Probing},
			{36 * s, "scrape-fail", Ejected},
		}},
		{"one 5xx while PROBING ejects", []step{
			{0, "scrape-fail", Ejected}, {30 * s, "scrape-ok", Ejected}, {33 * s, "scrape-ok", Probing},
			{36 * s, "req-fail", Ejected},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			m := NewMachine(&cfg, t0)
			for i, st := range tc.steps {
				st.apply(m)
				if got := m.State(); got != st.want {
					t.Fatalf("step %d (%s at +%s): state %s, want %s", i, st.do, st.at, got, st.want)
				}
			}
		})
	}
}

// flap ejects m at now and brings it back to LIVE through the way back,
// returning the cooldown it got and the instant it became LIVE.
func flap(t *testing.T, m *Machine, now time.Time) (time.Duration, time.Time) {
	t.Helper()
	tr := m.ObserveScrape(false, "refused", now)
	if len(tr) != 1 || tr[0].To != Ejected {
		t.Fatalf("eject at %s: transitions %+v", now, tr)
	}
	cd := tr[0].Cooldown
	now = now.Add(cd)
	m.ObserveScrape(true, "", now)
	now = now.Add(3 * time.Second)
	if tr := m.ObserveScrape(true, "", now); len(tr) != 1 || tr[0].To != Probing {
		t.Fatalf("probe at %s: transitions %+v", now, tr)
	}
	now = now.Add(15 * time.Second)
	if tr := m.Tick(now); len(tr) != 1 || tr[0].To != Live {
		t.Fatalf("live at %s: transitions %+v", now, tr)
	}
	return cd, now
}

func TestBackoffSequence(t *testing.T) {
	cfg := Default()
	m := NewMachine(&cfg, t0)
	now := t0
	want := []time.Duration{30, 60, 120, 240, 300, 300}
	for i, w := range want {
		var cd time.Duration
		cd, now = flap(t, m, now.Add(5*time.Second))
		if cd != w*time.Second {
			t.Errorf("ejection %d: cooldown %s, want %ds", i+1, cd, w)
		}
	}
	if m.CappedAt().IsZero() {
		t.Errorf("cooldown at the cap but CappedAt is zero")
	}
	if m.Ejections() != 6 {
		t.Errorf("ejections %d, want 6", m.Ejections())
	}
}

func TestStreakReset(t *testing.T) {
	tests := []struct {
		name   string
		steady time.Duration // LIVE time before the third eject
		want   time.Duration // its cooldown
	}{
		{"599 s of LIVE keeps the streak", 599 * time.Second, 120 * time.Second},
		{"600 s of steady LIVE resets the streak", 600 * time.Second, 30 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			cfg.FlapWindow = time.Hour // isolate the steady-LIVE rule
			m := NewMachine(&cfg, t0)
			_, now := flap(t, m, t0)
			_, now = flap(t, m, now)
			now = now.Add(tc.steady)
			m.Tick(now)
			cd, _ := flap(t, m, now)
			if cd != tc.want {
				t.Errorf("cooldown %s, want %s", cd, tc.want)
			}
		})
	}
}

func TestEjectOutsideFlapWindowStartsNewStreak(t *testing.T) {
	cfg := Default()
	m := NewMachine(&cfg, t0)
	m.ObserveScrape(false, "refused", t0)
	// Stays dead for 20 minutes, then flaps once: not a repeat within 10 min.
	now := t0.Add(20 * time.Minute)
	m.ObserveScrape(true, "", now)
	m.ObserveScrape(true, "", now.Add(3*time.Second))
	tr := m.ObserveScrape(false, "refused", now.Add(6*time.Second))
	if len(tr) != 1 || tr[0].Cooldown != 30*time.Second {
		t.Fatalf("transitions %+v, want one eject with 30s", tr)
	}
}

func TestTransitionsAreReturnedOnce(t *testing.T) {
	cfg := Default()
	m := NewMachine(&cfg, t0)
	if tr := m.ObserveScrape(false, "refused", t0); len(tr) != 1 || !strings.Contains(tr[0].Cause, "refused") {
		t.Fatalf("first failure: %+v", tr)
	}
	if tr := m.ObserveScrape(false, "refused", t0.Add(3*time.Second)); len(tr) != 0 {
		t.Fatalf("second failure: %+v, want none", tr)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"default is valid", func(*Config) {}, ""},
		{"zero eject threshold", func(c *Config) { c.ScrapeFailuresToEject = 0 }, "health.scrape_failures_to_eject"},
		{"negative window", func(c *Config) { c.ProbingWindow = -time.Second }, "health.probing_window"},
		{"cap below base", func(c *Config) { c.MaxCooldown = time.Second }, "health.max_cooldown"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			tc.mutate(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one naming %s", err, tc.want)
			}
		})
	}
}

// TestPendingReplica: a replica never seen healthy (docs/ROUTING.md,
// "Start-up order") gets no traffic, no cooldown and no ejection while its scrapes
// fail, and is LIVE on its first good scrape; after that the ordinary rules
// apply (a failed scrape ejects it with the base cooldown).
func TestPendingReplica(t *testing.T) {
	s := time.Second
	tests := []struct {
		name  string
		steps []step
	}{
		{"not ready until the first good scrape, then LIVE at once", []step{
			{0, "tick", Ejected}, {3 * s, "scrape-ok", Live},
		}},
		{"failed scrapes of a starting replica neither count nor damp", []step{
			{0, "scrape-fail", Ejected}, {3 * s, "scrape-fail", Ejected}, {6 * s, "scrape-fail", Ejected},
			{9 * s, "scrape-fail", Ejected}, {12 * s, "scrape-ok", Live},
		}},
		{"requests never make it ready", []step{
			{0, "req-ok", Ejected}, {1 * s, "req-ok", Ejected}, {2 * s, "tick", Ejected},
		}},
		{"once seen healthy the ordinary rules apply", []step{
			{0, "scrape-ok", Live}, {3 * s, "scrape-fail", Ejected}, {6 * s, "scrape-ok", Ejected},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Default()
			m := NewPendingMachine(&cfg, t0)
			for i, st := range tc.steps {
				st.apply(m)
				if got := m.State(); got != st.want {
					t.Fatalf("step %d (%s at +%s): state %s, want %s", i, st.do, st.at, got, st.want)
				}
				if st.want == Ejected && m.Pending() && (m.Ejections() != 0 || m.Cooldown() != 0 || m.CooldownLeft(t0.Add(st.at)) != 0) {
					t.Fatalf("step %d: a pending replica has ejections %d, cooldown %s", i, m.Ejections(), m.Cooldown())
				}
			}
		})
	}
	cfg := Default()
	m := NewPendingMachine(&cfg, t0)
	m.ObserveScrape(false, "refused", t0)
	tr := m.ObserveScrape(true, "", t0.Add(10*s))
	if len(tr) != 1 || tr[0].To != Live || m.Ejections() != 0 {
		t.Fatalf("first good scrape: transitions %+v, ejections %d", tr, m.Ejections())
	}
	if tr := m.ObserveScrape(false, "refused", t0.Add(13*s)); len(tr) != 1 || tr[0].Cooldown != cfg.BaseCooldown {
		t.Fatalf("first failure after joining: %+v, want an ejection with the base cooldown", tr)
	}
}

// A request loop ejects at once, from LIVE or PROBING; an EJECTED replica
// keeps its cooldown.
func TestEjectAtOnce(t *testing.T) {
	cfg := Default()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := NewMachine(&cfg, t0)
	ts := m.Eject("request loop", t0)
	if len(ts) != 1 || ts[0].To != Ejected || m.State() != Ejected {
		t.Fatalf("Eject from LIVE: %v, state %v; want one transition to EJECTED", ts, m.State())
	}
	if ts := m.Eject("request loop", t0.Add(time.Second)); len(ts) != 0 || m.Ejections() != 1 {
		t.Errorf("Eject while EJECTED: %v, %d ejections; want nothing new", ts, m.Ejections())
	}
}
