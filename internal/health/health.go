// Package health is the per-replica LIVE / PROBING / EJECTED machine of
// docs/ROUTING.md, "Health". It is pure: every call takes now, nothing runs in the
// background, and every state change is returned so the caller logs and counts
// it once.
package health

import (
	"errors"
	"fmt"
	"time"
)

// State is a replica's routing state.
type State int

// The three routing states of docs/ROUTING.md "Health". Replicas start LIVE.
const (
	Live State = iota
	Probing
	Ejected
)

// String returns LIVE, PROBING or EJECTED, the names /admin/replicas and the metrics use.
func (s State) String() string {
	switch s {
	case Live:
		return "LIVE"
	case Probing:
		return "PROBING"
	case Ejected:
		return "EJECTED"
	}
	return "UNKNOWN"
}

// Config holds the thresholds of docs/ROUTING.md "Health"; Default returns the defaults.
// The YAML keys (under routing.health) are given in brackets.
type Config struct {
	ScrapeFailuresToEject  int           // [scrape_failures_to_eject] consecutive failed scrapes that eject a LIVE replica (1)
	RequestFailuresToEject int           // [request_failures_to_eject] consecutive 5xx/transport errors of proxied requests that eject (3)
	ScrapeSuccessesToProbe int           // [scrape_successes_to_probe] successful scrapes after the cooldown: EJECTED -> PROBING (2)
	ProbingWindow          time.Duration // [probing_window] clean window: PROBING -> LIVE (15 s)
	BaseCooldown           time.Duration // [base_cooldown] first ejection's cooldown (30 s)
	MaxCooldown            time.Duration // [max_cooldown] cap (300 s)
	FlapWindow             time.Duration // [flap_window] a re-eject within this window doubles the cooldown (10 min)
	StreakReset            time.Duration // [streak_reset] steady LIVE that resets the streak (600 s)
}

// Default returns the default thresholds: 1 failed scrape or 3 failed proxied
// requests eject; 2 good scrapes after a 30 s * 2^(n-1) cooldown (cap 300 s)
// lead to PROBING, and a clean 15 s window to LIVE.
func Default() Config {
	return Config{
		ScrapeFailuresToEject:  1,
		RequestFailuresToEject: 3,
		ScrapeSuccessesToProbe: 2,
		ProbingWindow:          15 * time.Second,
		BaseCooldown:           30 * time.Second,
		MaxCooldown:            300 * time.Second,
		FlapWindow:             10 * time.Minute,
		StreakReset:            600 * time.Second,
	}
}

// Validate reports every bad threshold, naming its YAML key under health.
func (c Config) Validate() error {
	var errs []error
	positiveInt := func(key string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("health.%s: must be >= 1, got %d", key, v))
		}
	}
	positiveDur := func(key string, v time.Duration) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("health.%s: must be > 0, got %s", key, v))
		}
	}
	positiveInt("scrape_failures_to_eject", c.ScrapeFailuresToEject)
	positiveInt("request_failures_to_eject", c.RequestFailuresToEject)
	positiveInt("scrape_successes_to_probe", c.ScrapeSuccessesToProbe)
	positiveDur("probing_window", c.ProbingWindow)
	positiveDur("base_cooldown", c.BaseCooldown)
	positiveDur("max_cooldown", c.MaxCooldown)
	positiveDur("flap_window", c.FlapWindow)
	positiveDur("streak_reset", c.StreakReset)
	if c.MaxCooldown > 0 && c.MaxCooldown < c.BaseCooldown {
		errs = append(errs, fmt.Errorf("health.max_cooldown: must be >= health.base_cooldown (%s), got %s", c.BaseCooldown, c.MaxCooldown))
	}
	return errors.Join(errs...)
}

// Transition is one state change, returned by the call that caused it.
type Transition struct {
	From, To State
	Cause    string        // e.g. "scrape failed: connection refused", "2 scrapes ok", "clean window"
	Cooldown time.Duration // set when To == Ejected
	At       time.Time
}

// Machine is one replica's health state machine. It is not safe for
// concurrent use; the balancer calls it under its own lock.
type Machine struct {
	cfg   *Config
	state State
	since time.Time // when the current state was entered

	scrapeFailures  int // consecutive failed scrapes (LIVE)
	requestFailures int // consecutive failed proxied requests (LIVE)
	goodScrapes     int // consecutive good scrapes after the cooldown (EJECTED)

	ejections     int           // total ejections
	streak        int           // ejections in the current flap streak (n of 30 s * 2^(n-1))
	lastEject     time.Time     // time of the latest ejection
	cooldown      time.Duration // cooldown of the latest ejection (0 after a streak reset)
	cooldownUntil time.Time
	cappedAt      time.Time // when the cooldown reached MaxCooldown (zero when not at the cap)

	lastGoodScrape time.Time

	// pending: never seen healthy (NewPendingMachine). The replica is shown
	// EJECTED and gets no traffic, but with no cooldown and no ejection
	// counted; its first good scrape makes it LIVE.
	pending bool
}

// NewMachine returns a machine in LIVE (replicas start LIVE and are ejected by
// their first failed scrape). cfg must outlive the machine and have passed
// Validate. The benchmark and tests use it; `llmlb serve` uses
// NewPendingMachine.
func NewMachine(cfg *Config, now time.Time) *Machine {
	return &Machine{cfg: cfg, state: Live, since: now}
}

// NewPendingMachine returns a machine for a replica never seen healthy
// (at start-up): it is not yet ready, shown as EJECTED with no
// cooldown and no ejection counted, and gets no traffic. Failed scrapes leave
// it waiting without any flap damping (a replica that is still starting is
// not flapping); its first successful scrape makes it LIVE at once. The
// probing window of docs/ROUTING.md "Health" is the way *back* for a replica that failed
// (hysteresis against flapping); a brand-new replica has no failure to
// distrust, so it does not wait through it (docs/ROUTING.md).
func NewPendingMachine(cfg *Config, now time.Time) *Machine {
	return &Machine{cfg: cfg, state: Ejected, since: now, pending: true}
}

// Pending reports whether the replica has never been seen healthy.
func (m *Machine) Pending() bool { return m.pending }

// State returns the current routing state (after Tick(now) if time matters).
func (m *Machine) State() State { return m.state }

// Since returns when the current state was entered.
func (m *Machine) Since() time.Time { return m.since }

// Ejections returns how many times the replica was ejected.
func (m *Machine) Ejections() int { return m.ejections }

// Streak returns the number of ejections in the current flap streak.
func (m *Machine) Streak() int { return m.streak }

// Cooldown returns the latest ejection's cooldown; 0 once the streak reset.
func (m *Machine) Cooldown() time.Duration { return m.cooldown }

// CooldownLeft returns how much of the cooldown remains at now (0 when over
// or not EJECTED).
func (m *Machine) CooldownLeft(now time.Time) time.Duration {
	if m.state != Ejected || !now.Before(m.cooldownUntil) {
		return 0
	}
	return m.cooldownUntil.Sub(now)
}

// CappedAt returns when the cooldown reached MaxCooldown, or the zero time
// if the current streak has not reached the cap (docs/ROUTING.md "Alerts": it flaps).
func (m *Machine) CappedAt() time.Time { return m.cappedAt }

// LastGoodScrape returns the time of the latest successful scrape.
func (m *Machine) LastGoodScrape() time.Time { return m.lastGoodScrape }

// Tick performs the time-driven steps: PROBING -> LIVE after a clean
// ProbingWindow, and the streak reset after StreakReset of steady LIVE.
func (m *Machine) Tick(now time.Time) []Transition {
	var out []Transition
	if m.state == Probing && now.Sub(m.since) >= m.cfg.ProbingWindow {
		out = m.move(out, Live, "clean window", now)
	}
	if m.state == Live && m.streak > 0 && now.Sub(m.since) >= m.cfg.StreakReset {
		// Against flapping: only a long steady LIVE earns a short cooldown again.
		m.streak, m.cooldown, m.cappedAt = 0, 0, time.Time{}
	}
	return out
}

// ObserveScrape records one scrape of the replica's /metrics. cause says why
// a failed scrape failed (it becomes the Transition's cause).
func (m *Machine) ObserveScrape(ok bool, cause string, now time.Time) []Transition {
	out := m.Tick(now)
	if ok {
		m.lastGoodScrape = now
	}
	switch m.state {
	case Live:
		if ok {
			m.scrapeFailures = 0
			return out
		}
		m.scrapeFailures++
		if m.scrapeFailures >= m.cfg.ScrapeFailuresToEject {
			out = m.eject(out, "scrape failed: "+cause, now)
		}
	case Probing:
		if !ok {
			out = m.eject(out, "scrape failed while probing: "+cause, now)
		}
	case Ejected:
		if m.pending {
			if ok {
				m.pending = false
				out = m.move(out, Live, "first scrape ok (new replica)", now)
			}
			return out
		}
		// Users' requests are never probes: the way back is through scrapes only, and only those
		// after the cooldown count (hysteresis: stricter than the eject).
		if !ok || now.Before(m.cooldownUntil) {
			m.goodScrapes = 0
			return out
		}
		m.goodScrapes++
		if m.goodScrapes >= m.cfg.ScrapeSuccessesToProbe {
			out = m.move(out, Probing, fmt.Sprintf("%d scrapes ok", m.goodScrapes), now)
		}
	}
	return out
}

// ObserveRequest records the outcome of a proxied request: ok is false for a
// 5xx answer or a transport error. A client cancel must not be reported.
func (m *Machine) ObserveRequest(ok bool, cause string, now time.Time) []Transition {
	out := m.Tick(now)
	if ok {
		m.requestFailures = 0
		return out
	}
	switch m.state {
	case Live:
		m.requestFailures++
		if m.requestFailures >= m.cfg.RequestFailuresToEject {
			out = m.eject(out, fmt.Sprintf("%d failed requests: %s", m.requestFailures, cause), now)
		}
	case Probing:
		out = m.eject(out, "request failed while probing: "+cause, now)
	}
	return out
}

// Eject ejects a LIVE or PROBING replica at once, whatever its failure
// counts: cause is a failure that will repeat on every request (a request
// loop). An EJECTED replica stays as it is.
func (m *Machine) Eject(cause string, now time.Time) []Transition {
	out := m.Tick(now)
	if m.state == Ejected {
		return out
	}
	return m.eject(out, cause, now)
}

// eject moves to EJECTED with the flap-damped cooldown 30 s * 2^(n-1), capped.
func (m *Machine) eject(out []Transition, cause string, now time.Time) []Transition {
	if m.streak > 0 && now.Sub(m.lastEject) > m.cfg.FlapWindow {
		m.streak, m.cappedAt = 0, time.Time{}
	}
	m.streak++
	m.ejections++
	m.lastEject = now
	m.cooldown = m.cfg.BaseCooldown
	for i := 1; i < m.streak && m.cooldown < m.cfg.MaxCooldown; i++ {
		m.cooldown *= 2
	}
	if m.cooldown >= m.cfg.MaxCooldown {
		m.cooldown = m.cfg.MaxCooldown
		if m.cappedAt.IsZero() {
			m.cappedAt = now
		}
	}
	m.cooldownUntil = now.Add(m.cooldown)
	out = m.move(out, Ejected, cause, now)
	out[len(out)-1].Cooldown = m.cooldown
	return out
}

func (m *Machine) move(out []Transition, to State, cause string, now time.Time) []Transition {
	out = append(out, Transition{From: m.state, To: to, Cause: cause, At: now})
	m.state, m.since = to, now
	m.scrapeFailures, m.requestFailures, m.goodScrapes = 0, 0, 0
	return out
}
