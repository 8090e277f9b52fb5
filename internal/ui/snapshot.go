package ui

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/policy"
)

// Snapshot is everything the page shows at one instant: copies only, built
// at most once per Interval and shared by every subscriber.
type Snapshot struct {
	At              time.Time `json:"at"`
	Policy          string    `json:"policy"`
	IntervalSeconds float64   `json:"interval_seconds"`
	// TokenConfigured: the admin API expects a bearer token for mutations.
	TokenConfigured bool `json:"token_configured"`
	// OpenMutations: the admin API accepts mutations without a token.
	OpenMutations bool `json:"open_mutations"`
	// Authorized: this stream sees session keys in full (no token is
	// configured, or the stream presented it).
	Authorized  bool             `json:"authorized"`
	Fleet       Fleet            `json:"fleet"`
	Replicas    []Replica        `json:"replicas"`
	Alerts      []balancer.Alert `json:"alerts"`
	Transitions []Transition     `json:"transitions"` // newest first
	Decisions   []Decision       `json:"decisions"`   // newest first
	Pins        Pins             `json:"pins"`
	// Queue is flow control's queue of every model that has had one, by
	// model name.
	Queue []ModelQueue `json:"queue"`
}

// ModelQueue is flow control's queue of one model: requests wait there
// while every replica serving the model is full.
type ModelQueue struct {
	Model             string  `json:"model"`
	Queued            int     `json:"queued"`
	Bytes             int64   `json:"bytes"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
	// Classes has one row per priority with requests waiting, highest first.
	Classes []QueueClass `json:"classes"`
	// Tenants are the tenants with the most requests waiting (then running),
	// at most topQueueTenants.
	Tenants []QueueTenant `json:"tenants"`
	// Counters since the start.
	Dispatched uint64            `json:"dispatched"`
	Expired    uint64            `json:"expired"`
	Removed    uint64            `json:"removed"`
	Refused    map[string]uint64 `json:"refused"` // by reason
}

// QueueClass is the waiting requests of one priority.
type QueueClass struct {
	Priority          int     `json:"priority"`
	Queued            int     `json:"queued"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
}

// QueueTenant is one tenant's requests.
type QueueTenant struct {
	Tenant            string  `json:"tenant"`
	Queued            int     `json:"queued"`
	InFlight          int     `json:"in_flight"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
}

// Fleet is the fleet-wide summary.
type Fleet struct {
	RequestsPerSecond float64 `json:"requests_per_second"` // client requests routed, over the last 10 s
	AnsweredPerMinute uint64  `json:"answered_per_minute"` // client requests answered in the last minute
	ServerErrors      uint64  `json:"server_errors_per_minute"`
	StreamErrors      uint64  `json:"stream_errors_per_minute"`
	TTFTp50Seconds    float64 `json:"ttft_p50_seconds"` // time from selection to the first byte
	TTFTp99Seconds    float64 `json:"ttft_p99_seconds"`
	TTFTSamples       int     `json:"ttft_samples"`
	TTFTWindowSeconds float64 `json:"ttft_window_seconds"`
	ImbalanceIndex    float64 `json:"imbalance_index"`
	Live              int     `json:"live"`
	Probing           int     `json:"probing"`
	Ejected           int     `json:"ejected"`
	Draining          int     `json:"draining"`
	// RoutedHistory is the routing decisions per share bucket, oldest first.
	RoutedHistory       []uint64 `json:"routed_history"`
	ShareBucketSeconds  float64  `json:"share_bucket_seconds"`
	ShareHistorySeconds float64  `json:"share_history_seconds"`
}

// Replica is one replica's row: the admin API's status plus the dashboard's
// own figures.
type Replica struct {
	balancer.ReplicaStatus
	StateSeconds        float64 `json:"state_seconds"` // time in the current state
	CooldownLeftSeconds float64 `json:"cooldown_left_seconds"`
	// PrefixHitRate is cached / queried prompt tokens over the last minute
	// of scrapes; null when unknown or nothing was queried.
	PrefixHitRate *float64 `json:"prefix_hit_rate"`
	// Share is the replica's share of the routing decisions over the whole
	// history; ShareHistory per bucket, oldest first (0 in empty buckets).
	Share        float64   `json:"share"`
	ShareHistory []float64 `json:"share_history"`
}

// Transition is one health state change.
type Transition struct {
	At              time.Time `json:"at"`
	Replica         string    `json:"replica"`
	From            string    `json:"from"`
	To              string    `json:"to"`
	Cause           string    `json:"cause"`
	CooldownSeconds float64   `json:"cooldown_seconds,omitempty"`
}

// Decision is one routing decision with its explanation.
type Decision struct {
	Seq          uint64    `json:"seq"`
	At           time.Time `json:"at"`
	Replica      string    `json:"replica"`
	Reason       string    `json:"reason"`
	Attempt      int       `json:"attempt"`
	Model        string    `json:"model,omitempty"`
	Session      string    `json:"session,omitempty"`
	Prefix       bool      `json:"prefix"`
	PromptTokens int       `json:"prompt_tokens"`
	// Why is the explanation in words; Explanation the core's own record.
	Why         string               `json:"why"`
	Explanation balancer.Explanation `json:"explanation"`
}

// Pins counts the pin table and shows the busiest sessions per replica.
type Pins struct {
	Session   int               `json:"session"`
	Prefix    int               `json:"prefix"`
	ByReplica []ReplicaSessions `json:"by_replica"`
	// Window is how many recent decisions the session counts come from.
	Window int `json:"window"`
}

// ReplicaSessions are the sessions seen on one replica in the recent
// decisions, busiest first.
type ReplicaSessions struct {
	Replica  string         `json:"replica"`
	Sessions int            `json:"sessions"`
	Top      []SessionCount `json:"top"`
}

// SessionCount is one session's number of recent decisions.
type SessionCount struct {
	Session  string `json:"session"`
	Requests int    `json:"requests"`
}

// Snapshot builds a snapshot at now with session keys in full (the demo's
// screen and tests; the event stream redacts as configured).
func (d *Dashboard) Snapshot(now time.Time) *Snapshot {
	reps := d.bal.Replicas(now)
	times := d.bal.StateTimes(now)
	alerts := d.bal.Alerts(now)
	imbalance := d.bal.ImbalanceIndex(now)
	var sessionPins, prefixPins int
	d.bal.Inspect(func(p policy.Policy) {
		if t, ok := p.(policy.PinTable); ok {
			sessionPins, prefixPins = t.PinCounts()
		}
	})
	acc := d.access.Load()

	s := &Snapshot{
		At: now, Policy: d.bal.Policy(), IntervalSeconds: d.opts.Interval.Seconds(),
		TokenConfigured: acc.token != "", OpenMutations: acc.token == "" && acc.openMutations, Authorized: true,
		Alerts: alerts,
		Pins:   Pins{Session: sessionPins, Prefix: prefixPins},
	}
	if s.Alerts == nil {
		s.Alerts = []balancer.Alert{}
	}
	f := &s.Fleet
	f.ImbalanceIndex = imbalance
	f.TTFTWindowSeconds = d.opts.TTFTWindow.Seconds()
	f.ShareBucketSeconds = d.opts.ShareBucket.Seconds()
	f.ShareHistorySeconds = d.opts.ShareBucket.Seconds() * float64(d.opts.ShareBuckets)

	d.mu.Lock()
	// Requests per second and errors from the per-second ring.
	sec := now.Unix()
	for _, slot := range d.seconds {
		age := sec - slot.epoch
		if age < 0 || age >= 60 {
			continue
		}
		if age < int64(rateWindow/time.Second) {
			f.RequestsPerSecond += float64(slot.routed)
		}
		f.AnsweredPerMinute += slot.answered
		f.ServerErrors += slot.serverErrors
		f.StreamErrors += slot.streamErrors
	}
	f.RequestsPerSecond /= rateWindow.Seconds()

	// TTFT percentiles over the sliding window.
	from := now.Add(-d.opts.TTFTWindow).UnixNano()
	var ttfts []time.Duration
	for _, x := range d.ttft {
		if x.at > from && x.at <= now.UnixNano() {
			ttfts = append(ttfts, x.d)
		}
	}

	// Traffic share per bucket, oldest first.
	cur := now.UnixNano() / int64(d.opts.ShareBucket)
	n := int64(len(d.share))
	buckets := make([]*shareBucket, n)
	for i := range n {
		idx := cur - (n - 1) + i
		b := &d.share[((idx%n)+n)%n]
		if b.epoch == idx {
			buckets[i] = b
		}
	}
	f.RoutedHistory = make([]uint64, n)
	var total uint64
	for i, b := range buckets {
		if b != nil {
			f.RoutedHistory[i] = b.total
			total += b.total
		}
	}

	// Replicas with their times, hit rates and shares.
	s.Replicas = make([]Replica, len(reps))
	for i, r := range reps {
		row := Replica{ReplicaStatus: r, ShareHistory: make([]float64, n)}
		if j, ok := slices.BinarySearchFunc(times, r.Name, func(t balancer.StateTime, name string) int {
			return strings.Compare(t.Name, name)
		}); ok {
			row.StateSeconds = max(0, now.Sub(times[j].Since).Seconds())
			row.CooldownLeftSeconds = times[j].CooldownLeft.Seconds()
		}
		row.PrefixHitRate = hitRate(d.prefix[r.Name])
		var mine uint64
		for k, b := range buckets {
			if b != nil && b.total > 0 {
				c := b.counts[r.Name]
				mine += c
				row.ShareHistory[k] = float64(c) / float64(b.total)
			}
		}
		if total > 0 {
			row.Share = float64(mine) / float64(total)
		}
		s.Replicas[i] = row
		switch {
		case r.State == "EJECTED":
			f.Ejected++
		case r.State == "PROBING":
			f.Probing++
		default:
			f.Live++
		}
		if r.Draining {
			f.Draining++
		}
	}
	for name := range d.prefix { // forget removed replicas
		if !slices.ContainsFunc(reps, func(r balancer.ReplicaStatus) bool { return r.Name == name }) {
			delete(d.prefix, name)
		}
	}

	// Health transitions, newest first.
	held := min(d.transSeen, len(d.transitions))
	s.Transitions = make([]Transition, 0, held)
	for i := 1; i <= held; i++ {
		s.Transitions = append(s.Transitions, d.transitions[(d.transNext-i+len(d.transitions))%len(d.transitions)])
	}

	// Decisions and the sessions per replica in the ring.
	recent := d.decisions.last(DecisionsPerSnapshot)
	perReplica := map[string]map[string]int{}
	d.decisions.each(func(r *decisionRecord) {
		if r.Session == "" {
			return
		}
		m := perReplica[r.Replica]
		if m == nil {
			m = map[string]int{}
			perReplica[r.Replica] = m
		}
		m[r.Session]++
	})
	s.Pins.Window = d.decisions.len()
	d.mu.Unlock()

	f.TTFTSamples = len(ttfts)
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		f.TTFTp50Seconds = quantile(ttfts, 0.50).Seconds()
		f.TTFTp99Seconds = quantile(ttfts, 0.99).Seconds()
	}
	s.Decisions = make([]Decision, len(recent))
	for i, r := range recent {
		s.Decisions[i] = Decision{Seq: r.Seq, At: r.At, Replica: r.Replica, Reason: string(r.Reason),
			Attempt: r.Attempt, Model: r.Model, Session: r.Session, Prefix: r.Prefix,
			PromptTokens: r.PromptTokens, Why: Explain(r.Reason, r.Attempt, r.Replica, r.Explanation),
			Explanation: r.Explanation}
	}
	s.Pins.ByReplica = make([]ReplicaSessions, 0, len(reps))
	for _, r := range reps {
		m := perReplica[r.Name]
		rs := ReplicaSessions{Replica: r.Name, Sessions: len(m), Top: []SessionCount{}}
		for k, v := range m {
			rs.Top = append(rs.Top, SessionCount{Session: k, Requests: v})
		}
		slices.SortFunc(rs.Top, func(a, b SessionCount) int {
			return cmp.Or(cmp.Compare(b.Requests, a.Requests), strings.Compare(a.Session, b.Session))
		})
		rs.Top = rs.Top[:min(len(rs.Top), topSessions)]
		s.Pins.ByReplica = append(s.Pins.ByReplica, rs)
	}
	s.Queue = d.queue(now)
	return s
}

// queue copies flow control's statistics for the page, models by name.
func (d *Dashboard) queue(now time.Time) []ModelQueue {
	out := []ModelQueue{}
	if d.opts.Queue == nil {
		return out
	}
	for model, st := range d.opts.Queue(now) {
		mq := ModelQueue{Model: model, Queued: st.Queued, Bytes: st.Bytes, OldestWaitSeconds: st.OldestWait.Seconds(),
			Classes: make([]QueueClass, 0, len(st.Classes)), Tenants: []QueueTenant{},
			Dispatched: st.Dispatched, Expired: st.Expired, Removed: st.Removed, Refused: map[string]uint64{}}
		for _, c := range st.Classes {
			mq.Classes = append(mq.Classes, QueueClass{Priority: c.Priority, Queued: c.Queued, OldestWaitSeconds: c.OldestWait.Seconds()})
		}
		for _, t := range st.ByTenant {
			mq.Tenants = append(mq.Tenants, QueueTenant{Tenant: t.Tenant, Queued: t.Queued, InFlight: t.InFlight,
				OldestWaitSeconds: t.OldestWait.Seconds()})
		}
		slices.SortFunc(mq.Tenants, func(a, b QueueTenant) int {
			return cmp.Or(cmp.Compare(b.Queued, a.Queued), cmp.Compare(b.InFlight, a.InFlight), strings.Compare(a.Tenant, b.Tenant))
		})
		mq.Tenants = mq.Tenants[:min(len(mq.Tenants), topQueueTenants)]
		for r, n := range st.Refused {
			mq.Refused[r.String()] = n
		}
		out = append(out, mq)
	}
	slices.SortFunc(out, func(a, b ModelQueue) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// quantile is the nearest-rank quantile of sorted durations.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// hitRate is the prefix-cache hit rate between the oldest and the newest
// sample, or nil when no prompt tokens were queried in between.
func hitRate(s []hitSample) *float64 {
	if len(s) < 2 {
		return nil
	}
	q := s[len(s)-1].queries - s[0].queries
	h := s[len(s)-1].hits - s[0].hits
	if q <= 0 {
		return nil
	}
	v := min(max(h/q, 0), 1)
	return &v
}

// Explain puts a routing decision into words, in the terms of the policy
// that made it (balancer.Explanation.Why, the debug log's "why"), then how
// long flow control held the request and which attempt it was.
func Explain(reason balancer.Reason, attempt int, replica string, e balancer.Explanation) string {
	e.Reason, e.Replica = reason, replica
	var b strings.Builder
	b.WriteString(e.Why())
	if e.Queued > 0 {
		fmt.Fprintf(&b, "; queued %d ms (every replica was full)", e.Queued.Milliseconds())
	}
	if attempt > 1 {
		fmt.Fprintf(&b, "; attempt %d after a failure before the first byte", attempt)
	}
	if e.Policy != "" {
		fmt.Fprintf(&b, " [policy %s]", e.Policy)
	}
	return b.String()
}

// redacted returns a copy of s whose session keys are fingerprints, for
// streams that did not present the admin token.
func (s *Snapshot) redacted() *Snapshot {
	r := *s
	r.Authorized = false
	r.Decisions = slices.Clone(s.Decisions)
	for i := range r.Decisions {
		r.Decisions[i].Session = fingerprint(r.Decisions[i].Session)
	}
	r.Pins.ByReplica = slices.Clone(s.Pins.ByReplica)
	for i := range r.Pins.ByReplica {
		top := slices.Clone(r.Pins.ByReplica[i].Top)
		for j := range top {
			top[j].Session = fingerprint(top[j].Session)
		}
		r.Pins.ByReplica[i].Top = top
	}
	return &r
}

// fingerprint stands for a session key the viewer may not see: the same key
// always gives the same short text, so sessions can still be told apart.
func fingerprint(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return "#" + hex.EncodeToString(sum[:4])
}
