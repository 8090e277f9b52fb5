package policy

import (
	"math"
	"time"

	"github.com/llmlb/llmlb/internal/pins"
)

// LLMLB is the design documents' algorithm, steps 2-4 of the selection
// (docs/ROUTING.md): no-wait candidates, least effective running load, then
// soft session and prefix pins with TTLs and spill-based rebinding. It owns
// the pin table, which the admin API reads through PinTable.
//
// With warm set it is the hybrid policy llmlb-warm, which differs in the
// session pin test only (prefix pins keep llmlb's rules): a session pin is
// usable while its replica is LIVE, reported no queue at its last scrape
// (scraped num_waiting, not effective_waiting), and it runs fewer requests
// than max(min_r + force_rebind_gap, rebind_ratio * mean_r), loads counted
// in requests (max(scraped running, in-flight count)), not token weights.
// Our own requests the last scrape has not seen yet (typically the rest of
// the same agent burst) and long prompts then no longer break the pin; at
// the gap it moves at once as in llmlb. Steps 2 and 3 are unchanged, so a
// replica between two scrapes still counts our own requests. docs/benchmarks/LAB-2026.md
// shows why it exists.
type LLMLB struct {
	Base
	cfg   AffinityConfig
	warm  bool
	table *pins.Table
	fleet Fleet
	rr    uint64 // round-robin counter of step 3's tie-break

	counters PinCounters
	// minCount and meanCount are the min and mean over step 2's candidates
	// of max(scraped running, in-flight count): llmlb-warm's loads in
	// requests for the pin tests.
	minCount, meanCount float64
	// before is the request's pins as Choose found them, for Routed to
	// publish what changed (shared state only).
	before [2]pinState
}

// NewLLMLB returns policy llmlb (warm: llmlb-warm) with an empty pin table.
// cfg must have passed Validate.
func NewLLMLB(cfg AffinityConfig, warm bool) *LLMLB {
	return &LLMLB{cfg: cfg, warm: warm, table: pins.New(cfg.pins())}
}

// Name returns "llmlb" or "llmlb-warm".
func (l *LLMLB) Name() string {
	if l.warm {
		return NameLLMLBWarm
	}
	return NameLLMLB
}

// Attach keeps the fleet view: a pin's replica may not be a candidate.
func (l *LLMLB) Attach(f Fleet) { l.fleet = f }

// warmGap is the gap to min_r, in requests, at which llmlb-warm moves a
// pin: force_rebind_gap, or up to rebind_ratio times the mean load when that
// is larger (the bound of consistent hashing with bounded loads). A pin thus
// survives the differences continuous batching absorbs on busy replicas (a
// few requests more among 40 running cost little; recomputing a 20K-token
// context costs a second of GPU time) but not a replica far above the mean.
func (l *LLMLB) warmGap() float64 {
	return max(l.cfg.ForceRebindGap, l.cfg.RebindRatio*l.meanCount-l.minCount)
}

// countRunning is a replica's running in requests, not tokens:
// max(scraped running, in-flight count), peers' in-flight requests included.
func countRunning(c *Candidate) float64 { return max(c.ScrapedRunning, float64(c.InFlight)) }

// candidateSet is step 2's choice of candidates, narrowest first.
type candidateSet int

const (
	noWait   candidateSet = iota // LIVE replicas with effective_waiting == 0
	live                         // LIVE replicas
	routable                     // LIVE and PROBING replicas
)

// setNames are the candidate sets as the explanation shows them.
var setNames = [...]string{noWait: "no-wait", live: "live", routable: "routable"}

// Choose runs steps 2-4 on the core's pool (cands, len > 0).
func (l *LLMLB) Choose(p *Request, cands []Candidate, now time.Time) Choice {
	if l.fleet != nil && l.fleet.Sharer() != nil {
		l.before = l.pinsBefore(p, now)
	}

	// Step 2. No-wait: if some LIVE replica has effective_waiting == 0, only
	// those are candidates; otherwise LIVE ones; otherwise all routable. A
	// new session thus lands on a cold, idle replica, not in someone's queue.
	set := routable
	for i := range cands {
		if c := &cands[i]; c.Live {
			set = live
			if c.EffectiveWaiting == 0 {
				set = noWait
				break
			}
		}
	}
	in := func(c *Candidate) bool {
		return set == routable || c.Live && (set == live || c.EffectiveWaiting == 0)
	}

	// Step 3. Least-loaded: the minimum effective_running (min_r); ties
	// broken round-robin, LIVE preferred over PROBING.
	considered := 0
	minR, liveAtMin := math.Inf(1), false
	for i := range cands {
		c := &cands[i]
		if !in(c) {
			continue
		}
		considered++
		switch {
		case c.EffectiveRunning < minR:
			minR, liveAtMin = c.EffectiveRunning, c.Live
		case c.EffectiveRunning == minR:
			liveAtMin = liveAtMin || c.Live
		}
	}
	if l.warm {
		l.minCount = math.Inf(1)
		sum, n := 0.0, 0
		for i := range cands {
			if in(&cands[i]) {
				c := countRunning(&cands[i])
				l.minCount = min(l.minCount, c)
				sum += c
				n++
			}
		}
		l.meanCount = sum / float64(n)
	}
	best, n := -1, len(cands)
	start := int(l.rr % uint64(n)) // round-robin: rotate the starting point
	l.rr++
	for j := range n {
		i := start + j
		if i >= n {
			i -= n
		}
		if c := &cands[i]; in(c) && c.EffectiveRunning == minR && c.Live == liveAtMin {
			best = i
			break
		}
	}

	// Step 4. Pin (soft sticky): session key first, then prefix key.
	choice := l.pin(p, cands, best, minR, now)
	choice.Candidates, choice.CandidateSet, choice.MinRunning = considered, setNames[set], minR
	return choice
}

// pin applies step 4 and the pin life cycle to the least-loaded choice best.
func (l *LLMLB) pin(p *Request, cands []Candidate, best int, minR float64, now time.Time) Choice {
	choice := Choice{Index: best, Reason: ReasonLoad}
	bestLive := cands[best].Live // new pins only on LIVE replicas
	bestName := cands[best].Name

	kind, key, pinned, found := l.lookup(p, now)
	if found {
		choice.PinKind, choice.PinReplica = kind.String(), pinned
		slack := l.cfg.SessionSlack
		if kind == pins.Prefix {
			slack = l.cfg.PrefixSlack
		}
		idx := indexOf(cands, pinned)
		switch {
		case l.fleet != nil && !l.fleet.Alive(pinned):
			// A pin on a dead (EJECTED, removed, draining) replica never blocks.
			choice.PinDecision = "dead"
			if bestLive {
				l.table.Bind(kind, key, bestName, now)
				l.counters.Rebinds++
				choice.PinDecision = "dead: rebind"
			} else {
				l.table.Delete(kind, key)
			}
		case idx < 0:
			// Serves another model, already tried, or a PROBING replica at its
			// in-flight limit: not usable, and not the pin's fault.
			choice.PinDecision = "skip: not a candidate"
		case l.usable(kind, &cands[idx], minR, slack):
			l.table.Use(kind, key, now)
			choice.Index, choice.Reason, choice.PinDecision = idx, ReasonAffinity, "used"
		default:
			choice.PinDecision = l.spill(kind, key, &cands[idx], minR, bestName, bestLive, now)
		}
	}

	// New pins, made only on LIVE replicas (PROBING accepts no pins).
	chosen := cands[choice.Index]
	if chosen.Live {
		if p.SessionKey != "" && !(found && kind == pins.Session) {
			if _, _, ok := l.table.Lookup(pins.Session, p.SessionKey, now); !ok {
				l.table.Bind(pins.Session, p.SessionKey, chosen.Name, now)
				noteNew(&choice, pins.Session)
			}
		}
		if p.PrefixKey != "" && !(found && kind == pins.Prefix) {
			if _, _, ok := l.table.Lookup(pins.Prefix, p.PrefixKey, now); !ok {
				l.table.Bind(pins.Prefix, p.PrefixKey, chosen.Name, now)
				noteNew(&choice, pins.Prefix)
			}
		}
	}
	return choice
}

// noteNew records a new pin in the explanation when no pin was consulted.
func noteNew(c *Choice, kind pins.Kind) {
	if c.PinDecision == "" {
		c.PinKind, c.PinDecision = kind.String(), "new"
	}
}

// usable is step 4's test: the pin's replica is LIVE, has no queue and
// effective_running <= min_r + slack. llmlb-warm's test for session pins:
// LIVE, no queue in the last scrape, and a gap in requests below warmGap.
func (l *LLMLB) usable(kind pins.Kind, c *Candidate, minR, slack float64) bool {
	if l.warm && kind == pins.Session {
		// The pin holds until the gap that would move it at once.
		gap := countRunning(c) - l.minCount
		return c.Live && c.ScrapedWaiting == 0 && gap < l.warmGap()
	}
	return c.Live && c.EffectiveWaiting == 0 && c.EffectiveRunning <= minR+slack
}

// spill handles an unusable pin and returns the decision: a gap of
// force_rebind_gap moves it at once; otherwise the spill is counted, and the
// pin table rebinds a session pin after spills_to_rebind or drops a prefix
// pin after a repeated spill. A pin that moved only after several spills
// keeps a burst's warm cache; one that never moved would queue behind a
// busy replica forever.
func (l *LLMLB) spill(kind pins.Kind, key string, c *Candidate, minR float64, bestName string, bestLive bool, now time.Time) string {
	running, waiting := c.EffectiveRunning, c.EffectiveWaiting
	gapLimit := l.cfg.ForceRebindGap
	if l.warm && kind == pins.Session {
		running, minR, gapLimit = countRunning(c), l.minCount, l.warmGap()
	}
	l.counters.Spills++
	var decision string
	switch {
	case !c.Live:
		decision = "spill: not LIVE"
	case waiting > 0 && !(l.warm && kind == pins.Session && c.ScrapedWaiting == 0):
		decision = "spill: queue"
	default:
		decision = "spill: running > min_r+slack"
	}
	if running-minR >= gapLimit && bestLive {
		l.table.Bind(kind, key, bestName, now)
		l.counters.ForceRebinds++
		return "force rebind"
	}
	switch l.table.Spill(kind, key, bestName, bestLive, now) {
	case pins.Rebound:
		l.counters.Rebinds++
		decision = "rebind"
	case pins.Dropped:
		l.counters.PrefixDrops++
		decision = "prefix dropped"
	}
	return decision
}

// lookup finds the pin to consult: the session key's pin first, then the
// prefix key's.
func (l *LLMLB) lookup(p *Request, now time.Time) (kind pins.Kind, key, replica string, ok bool) {
	if p.SessionKey != "" {
		if replica, _, ok = l.table.Lookup(pins.Session, p.SessionKey, now); ok {
			return pins.Session, p.SessionKey, replica, true
		}
	}
	if p.PrefixKey != "" {
		if replica, _, ok = l.table.Lookup(pins.Prefix, p.PrefixKey, now); ok {
			return pins.Prefix, p.PrefixKey, replica, true
		}
	}
	return 0, "", "", false
}

// indexOf returns the index of the candidate named name, or -1.
func indexOf(cands []Candidate, name string) int {
	for i := range cands {
		if cands[i].Name == name {
			return i
		}
	}
	return -1
}

// RemoveReplica drops the replica's pins.
func (l *LLMLB) RemoveReplica(name string) { l.table.RemoveReplica(name) }

// Tick expires at most affinity.sweep_budget pins.
func (l *LLMLB) Tick(now time.Time) { l.table.Sweep(now, l.cfg.SweepBudget) }

// SetSettings applies new pin rules; the pins are kept.
func (l *LLMLB) SetSettings(s Settings) error {
	if err := s.Affinity.Validate(); err != nil {
		return err
	}
	l.cfg = s.Affinity
	l.table.SetConfig(s.Affinity.pins())
	return nil
}
