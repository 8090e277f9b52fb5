// Package health is the per-replica LIVE / PROBING / EJECTED machine of SPEC
// s4 (incidents 3 and 4). It is pure: every call takes now, nothing runs in the
// background, and every state change is returned so the caller logs and counts
// it once.
package health

import "time"

// State is a replica's routing state.
type State int

const (
	Live State = iota
	Probing
	Ejected
)

// String returns LIVE, PROBING or EJECTED, the names of SPEC s10.
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

// Config holds the thresholds of SPEC s4; Default returns the seed's values.
type Config struct {
	ScrapeFailuresToEject  int           // consecutive failed scrapes that eject a LIVE replica
	RequestFailuresToEject int           // consecutive 5xx/transport errors of proxied requests that eject
	ScrapeSuccessesToProbe int           // successful scrapes after the cooldown: EJECTED -> PROBING (2)
	ProbingWindow          time.Duration // clean window: PROBING -> LIVE (15 s)
	BaseCooldown           time.Duration // first ejection's cooldown (30 s)
	MaxCooldown            time.Duration // cap (300 s)
	FlapWindow             time.Duration // a re-eject within this window doubles the cooldown (10 min)
	StreakReset            time.Duration // steady LIVE that resets the streak (600 s)
}

// Transition is one state change, returned by the call that caused it.
type Transition struct {
	From, To State
	Cause    string        // e.g. "scrape failed: connection refused", "2 scrapes ok", "clean window"
	Cooldown time.Duration // set when To == Ejected
	At       time.Time
}
