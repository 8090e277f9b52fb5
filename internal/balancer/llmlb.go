package balancer

import (
	"math"
	"time"

	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/pins"
	"github.com/llmlb/llmlb/internal/policy"
)

// llmlb is the seed 002 algorithm, steps 2-4 of SPEC s3, as a policy.Policy.
// It runs under the balancer's lock, reads the replicas behind the
// candidates (b.candReps, index-aligned) and owns the pin table.
//
// With warm set it is the hybrid policy llmlb-warm, which differs in the
// session pin test only (docs/ROUTING.md; prefix pins keep llmlb's rules,
// incident 1): a session pin is usable while its replica is LIVE,
// reported no queue at its last scrape (scraped num_waiting, not
// effective_waiting), and it runs fewer requests than
// max(min_r + force_rebind_gap, rebind_ratio * mean_r), loads counted in
// requests (max(scraped running, in-flight count)), not token weights. Our own requests the last scrape has
// not seen yet (typically the rest of the same agent burst) and long prompts
// then no longer break the pin; at the gap it moves at once as in llmlb.
// Steps 2 and 3 are unchanged, so incident 2 stays fixed. BENCHMARKS.md
// shows why it exists.
type llmlb struct {
	b    *Balancer
	warm bool
	// minCount and meanCount are the min and mean over step 2's candidates
	// of max(scraped running, in-flight count): llmlb-warm's loads in
	// requests for the pin tests.
	minCount, meanCount float64
}

// warmGap is the gap to min_r, in requests, at which llmlb-warm moves a
// pin: force_rebind_gap, or up to rebind_ratio times the mean load when that
// is larger (the bound of consistent hashing with bounded loads). A pin thus
// survives the differences continuous batching absorbs on busy replicas (a
// few requests more among 40 running cost little; recomputing a 20K-token
// context costs a second of GPU time) but not a replica far above the mean.
func (l *llmlb) warmGap() float64 {
	a := l.b.cfg.Affinity
	return max(a.ForceRebindGap, a.RebindRatio*l.meanCount-l.minCount)
}

// countRunning is a replica's running in requests, not tokens:
// max(scraped running, in-flight count).
// Peers' in-flight requests count too (shared state).
func countRunning(r *replica) float64 { return max(r.snap.Running, float64(r.inFlight+r.peerInFlight)) }

// Name returns "llmlb" or "llmlb-warm".
func (l *llmlb) Name() string {
	if l.warm {
		return PolicyLLMLBWarm
	}
	return PolicyLLMLB
}

// candidateSet is step 2's choice of candidates, narrowest first.
type candidateSet int

const (
	noWait   candidateSet = iota // LIVE replicas with effective_waiting == 0
	live                         // LIVE replicas
	routable                     // LIVE and PROBING replicas
)

// setNames are the candidate sets as Explanation.CandidateSet shows them.
var setNames = [...]string{noWait: "no-wait", live: "live", routable: "routable"}

// Choose runs steps 2-4 on step 1's pool (cands, len > 0).
func (l *llmlb) Choose(p *policy.Request, cands []policy.Candidate, now time.Time) policy.Choice {
	b, e := l.b, &l.b.expl

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
	in := func(c *policy.Candidate) bool {
		return set == routable || c.Live && (set == live || c.EffectiveWaiting == 0)
	}
	e.CandidateSet = setNames[set]

	// Step 3. Least-loaded: the minimum effective_running (min_r); ties
	// broken round-robin, LIVE preferred over PROBING.
	minR, liveAtMin := math.Inf(1), false
	for i := range cands {
		c := &cands[i]
		if !in(c) {
			continue
		}
		e.Candidates++
		switch {
		case c.EffectiveRunning < minR:
			minR, liveAtMin = c.EffectiveRunning, c.Live
		case c.EffectiveRunning == minR:
			liveAtMin = liveAtMin || c.Live
		}
	}
	e.MinRunning = minR
	if l.warm {
		l.minCount = math.Inf(1)
		sum, n := 0.0, 0
		for i := range cands {
			if in(&cands[i]) {
				c := countRunning(b.candReps[i])
				l.minCount = min(l.minCount, c)
				sum += c
				n++
			}
		}
		l.meanCount = sum / float64(n)
	}
	best, n := -1, len(cands)
	start := int(b.rr % uint64(n)) // round-robin: rotate the starting point
	b.rr++
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
	return l.pin(p, cands, best, minR, now)
}

// pin applies step 4 and the pin life cycle to the least-loaded choice best.
func (l *llmlb) pin(p *policy.Request, cands []policy.Candidate, best int, minR float64, now time.Time) policy.Choice {
	b, e := l.b, &l.b.expl
	choice := policy.Choice{Index: best, Reason: string(ReasonLoad)}
	bestLive := cands[best].Live // new pins only on LIVE replicas
	bestName := cands[best].Name

	kind, key, pinned, found := l.lookup(p, now)
	if found {
		e.PinKind, e.PinReplica = kind.String(), pinned
		slack := b.cfg.Affinity.SessionSlack
		if kind == pins.Prefix {
			slack = b.cfg.Affinity.PrefixSlack
		}
		r := b.byName[pinned]
		idx := l.indexOf(r)
		switch {
		case r == nil || r.draining || r.health.State() == health.Ejected:
			// A pin on a dead (EJECTED, removed, draining) replica never blocks.
			e.PinDecision = "dead"
			if bestLive {
				b.pins.Bind(kind, key, bestName, now)
				b.counters.Rebinds++
				e.PinDecision = "dead: rebind"
			} else {
				b.pins.Delete(kind, key)
			}
		case idx < 0:
			// Serves another model, already tried, or a PROBING replica at its
			// in-flight limit: not usable, and not the pin's fault.
			e.PinDecision = "skip: not a candidate"
		case l.usable(kind, r, minR, slack):
			b.pins.Use(kind, key, now)
			e.PinDecision = "used"
			choice = policy.Choice{Index: idx, Reason: string(ReasonAffinity)}
		default:
			l.spill(kind, key, r, minR, bestName, bestLive, now)
		}
	}

	// New pins, made only on LIVE replicas (PROBING accepts no pins).
	chosen := cands[choice.Index]
	if chosen.Live {
		if p.SessionKey != "" && !(found && kind == pins.Session) {
			if _, _, ok := b.pins.Lookup(pins.Session, p.SessionKey, now); !ok {
				b.pins.Bind(pins.Session, p.SessionKey, chosen.Name, now)
				l.noteNew(pins.Session)
			}
		}
		if p.PrefixKey != "" && !(found && kind == pins.Prefix) {
			if _, _, ok := b.pins.Lookup(pins.Prefix, p.PrefixKey, now); !ok {
				b.pins.Bind(pins.Prefix, p.PrefixKey, chosen.Name, now)
				l.noteNew(pins.Prefix)
			}
		}
	}
	return choice
}

// noteNew records a new pin in the explanation when no pin was consulted.
func (l *llmlb) noteNew(kind pins.Kind) {
	if e := &l.b.expl; e.PinDecision == "" {
		e.PinKind, e.PinDecision = kind.String(), "new"
	}
}

// usable is SPEC s3 step 4's test: the pin's replica is LIVE, has no queue
// and effective_running <= min_r + slack. llmlb-warm's test for session
// pins: LIVE, no queue in the last scrape, and a gap in requests below warmGap.
func (l *llmlb) usable(kind pins.Kind, r *replica, minR, slack float64) bool {
	if l.warm && kind == pins.Session {
		// The pin holds until the gap that would move it at once.
		gap := countRunning(r) - l.minCount
		return r.health.State() == health.Live && r.snap.Waiting == 0 && gap < l.warmGap()
	}
	running, waiting := r.effective()
	return r.health.State() == health.Live && waiting == 0 && running <= minR+slack
}

// spill handles an unusable pin (incident 1): a gap of force_rebind_gap
// moves it at once; otherwise the spill is counted, and the pin table
// rebinds a session pin after spills_to_rebind or drops a prefix pin after
// a repeated spill.
func (l *llmlb) spill(kind pins.Kind, key string, r *replica, minR float64, bestName string, bestLive bool, now time.Time) {
	b, e := l.b, &l.b.expl
	running, waiting := r.effective()
	gapLimit := b.cfg.Affinity.ForceRebindGap
	if l.warm && kind == pins.Session {
		running, minR, gapLimit = countRunning(r), l.minCount, l.warmGap()
	}
	b.counters.Spills++
	switch {
	case r.health.State() != health.Live:
		e.PinDecision = "spill: not LIVE"
	case waiting > 0 && !(l.warm && kind == pins.Session && r.snap.Waiting == 0):
		e.PinDecision = "spill: queue"
	default:
		e.PinDecision = "spill: running > min_r+slack"
	}
	if running-minR >= gapLimit && bestLive {
		b.pins.Bind(kind, key, bestName, now)
		b.counters.ForceRebinds++
		e.PinDecision = "force rebind"
		return
	}
	switch b.pins.Spill(kind, key, bestName, bestLive, now) {
	case pins.Rebound:
		b.counters.Rebinds++
		e.PinDecision = "rebind"
	case pins.Dropped:
		b.counters.PrefixDrops++
		e.PinDecision = "prefix dropped"
	}
}

// lookup finds the pin to consult: the session key's pin first, then the
// prefix key's.
func (l *llmlb) lookup(p *policy.Request, now time.Time) (kind pins.Kind, key, replica string, ok bool) {
	if p.SessionKey != "" {
		if replica, _, ok = l.b.pins.Lookup(pins.Session, p.SessionKey, now); ok {
			return pins.Session, p.SessionKey, replica, true
		}
	}
	if p.PrefixKey != "" {
		if replica, _, ok = l.b.pins.Lookup(pins.Prefix, p.PrefixKey, now); ok {
			return pins.Prefix, p.PrefixKey, replica, true
		}
	}
	return 0, "", "", false
}

// indexOf returns r's index among the candidates, or -1.
func (l *llmlb) indexOf(r *replica) int {
	for i, c := range l.b.candReps {
		if c == r {
			return i
		}
	}
	return -1
}
