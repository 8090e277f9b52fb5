// Package ui is llmlb's live dashboard on the admin listener:
// one page embedded in the binary (GET /ui) fed by a server-sent event
// stream (GET /admin/events).
//
// The hot path only records: every routing decision, first byte, answered
// request, health transition and scrape result is copied into small bounded
// rings under the dashboard's own lock (never the routing core's). Once per
// Interval, and only while someone watches, one Snapshot is built from those
// copies and from the core's copying accessors, encoded once, and shared by
// all subscribers; a subscriber that cannot keep up skips snapshots or is
// dropped, so the page never slows routing.
package ui

import (
	"crypto/sha256"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/scrape"
)

// Defaults of Options' zero values.
const (
	DefaultInterval       = time.Second
	DefaultMaxSubscribers = 16
	DefaultMaxStreamAge   = 5 * time.Minute
	DefaultDecisions      = 1024
	DefaultTTFTWindow     = time.Minute
	DefaultShareBucket    = 10 * time.Second
	DefaultShareBuckets   = 30 // 5 minutes of 10 s buckets
	// DecisionsPerSnapshot is how many of the latest decisions each snapshot
	// carries; the page merges them by sequence number.
	DecisionsPerSnapshot = 60
	rateWindow           = 10 * time.Second // requests/s is averaged over it
	ttftSamples          = 4096
	maxTransitions       = 50
	hitRateWindow        = time.Minute
	topSessions          = 5
	topQueueTenants      = 5
)

// Options configures a Dashboard. Balancer is required.
type Options struct {
	Balancer *balancer.Balancer
	// Token is the admin token. When set, session keys are sent in full only
	// to event streams that present it (Authorization: Bearer); others see
	// a short fingerprint, as /admin/pins is guarded by the same token.
	// SetAccess changes it at run time (a reloaded configuration).
	Token string
	// OpenMutations: the admin API accepts mutations without a token (none
	// is configured and unauthenticated mutations are allowed); the page
	// then offers drain / undrain at once.
	OpenMutations bool
	// Interval between snapshots (default 1 s).
	Interval time.Duration
	// MaxSubscribers bounds concurrent event streams (default 16); more get
	// 503, except a subscriber holding the admin token or connecting from
	// loopback, for whom the oldest anonymous stream is dropped.
	MaxSubscribers int
	// MaxStreamAge ends an anonymous event stream after this long (default
	// 5 min; the page's EventSource reconnects), so idle subscribers do not
	// hold their slots forever.
	MaxStreamAge time.Duration
	// Decisions is the size of the ring of recent decisions (default 1024).
	Decisions int
	// TTFTWindow is the sliding window of the TTFT percentiles (default 1 min).
	TTFTWindow time.Duration
	// ShareBucket and ShareBuckets shape the traffic-share history (default
	// 30 buckets of 10 s).
	ShareBucket  time.Duration
	ShareBuckets int
	// Queue returns flow control's queues at now, by model (the server's
	// admission.Gate.Stats); nil shows no queue.
	Queue  func(now time.Time) map[string]flowcontrol.Stats
	Logger *slog.Logger
	Now    func() time.Time
}

// Dashboard records what the page shows and serves it. Its recording
// methods are safe for concurrent use and cheap: a short critical section on
// the dashboard's own lock, no allocation beyond copying two strings.
type Dashboard struct {
	opts Options
	bal  *balancer.Balancer
	log  *slog.Logger
	now  func() time.Time

	mu          sync.Mutex
	decisions   decisionRing
	ttft        []ttftSample // ring of ttftSamples
	ttftNext    int
	seconds     [60]secondSlot // per-second counters (requests/s, 5xx)
	share       []shareBucket  // traffic-share history ring
	transitions []Transition   // ring of the latest health transitions
	transNext   int            // next slot of transitions
	transSeen   int            // transitions recorded (to know the ring's fill)
	prefix      map[string][]hitSample

	pub         sync.Mutex // guards latest
	latest      *published
	buildMu     sync.Mutex // one build at a time
	access      atomic.Pointer[access]
	subscribers atomic.Int32
	subsMu      sync.Mutex
	subs        []*subscriber              // open event streams, oldest first
	local       func(r *http.Request) bool // whether r comes from loopback
	closed      chan struct{}
	closeOnce   sync.Once
}

type ttftSample struct {
	at int64 // unix nanos
	d  time.Duration
}

type secondSlot struct {
	epoch                      int64 // unix second the slot holds
	routed, answered           uint64
	serverErrors, streamErrors uint64
}

type shareBucket struct {
	epoch  int64 // bucket number (unix nanos / ShareBucket)
	total  uint64
	counts map[string]uint64
}

type hitSample struct {
	at            time.Time
	queries, hits float64
}

// New returns a dashboard; it starts nothing (Run is the snapshot loop).
func New(opts Options) *Dashboard {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.MaxSubscribers <= 0 {
		opts.MaxSubscribers = DefaultMaxSubscribers
	}
	if opts.MaxStreamAge <= 0 {
		opts.MaxStreamAge = DefaultMaxStreamAge
	}
	if opts.Decisions <= 0 {
		opts.Decisions = DefaultDecisions
	}
	if opts.TTFTWindow <= 0 {
		opts.TTFTWindow = DefaultTTFTWindow
	}
	if opts.ShareBucket <= 0 {
		opts.ShareBucket = DefaultShareBucket
	}
	if opts.ShareBuckets <= 0 {
		opts.ShareBuckets = DefaultShareBuckets
	}
	d := &Dashboard{
		opts:        opts,
		bal:         opts.Balancer,
		log:         opts.Logger,
		now:         opts.Now,
		decisions:   newDecisionRing(opts.Decisions),
		ttft:        make([]ttftSample, ttftSamples),
		share:       make([]shareBucket, opts.ShareBuckets),
		transitions: make([]Transition, maxTransitions),
		prefix:      make(map[string][]hitSample),
		closed:      make(chan struct{}),
	}
	d.SetAccess(opts.Token, opts.OpenMutations)
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d
}

// access is who may see session keys and mutate, swapped as a whole.
type access struct {
	token         string
	tokenSum      [sha256.Size]byte
	openMutations bool
}

// SetAccess sets the admin token and whether mutations need none, for
// streams opened and snapshots built from now on (a reloaded configuration).
func (d *Dashboard) SetAccess(token string, openMutations bool) {
	d.access.Store(&access{token: token, tokenSum: sha256.Sum256([]byte(token)), openMutations: openMutations})
}

// Decision records one routing decision (proxy.Options.Decisions).
func (d *Dashboard) Decision(at time.Time, res *balancer.Reservation, prof *request.Profile, attempt int) {
	if res == nil {
		return
	}
	rec := decisionRecord{
		At: at, Replica: res.Replica, Reason: res.Reason, Attempt: attempt,
		Explanation: res.Explanation,
	}
	if prof != nil {
		// Cloned: the ring must not keep a request's body alive.
		rec.Model, rec.Session = strings.Clone(prof.Model), strings.Clone(prof.SessionKey)
		rec.Prefix, rec.PromptTokens = prof.PrefixKey != "", prof.PromptTokens
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.decisions.add(rec)
	if attempt <= 1 {
		d.second(at).routed++
	}
	b := d.bucket(at)
	b.total++
	if b.counts == nil {
		b.counts = make(map[string]uint64)
	}
	b.counts[res.Replica]++
}

// second returns the per-second slot of at, reset if it held an older second.
func (d *Dashboard) second(at time.Time) *secondSlot {
	sec := at.Unix()
	s := &d.seconds[((sec%60)+60)%60]
	if s.epoch != sec {
		*s = secondSlot{epoch: sec}
	}
	return s
}

// bucket returns the share bucket of at, reset if it held an older one.
func (d *Dashboard) bucket(at time.Time) *shareBucket {
	idx := at.UnixNano() / int64(d.opts.ShareBucket)
	n := int64(len(d.share))
	b := &d.share[((idx%n)+n)%n]
	if b.epoch != idx {
		clear(b.counts)
		b.epoch, b.total = idx, 0
	}
	return b
}

// FirstByte records a time to first byte (proxy.Recorder).
func (d *Dashboard) FirstByte(_ string, dur time.Duration) {
	at := d.now().UnixNano()
	d.mu.Lock()
	d.ttft[d.ttftNext] = ttftSample{at: at, d: dur}
	d.ttftNext = (d.ttftNext + 1) % len(d.ttft)
	d.mu.Unlock()
}

// Request counts one answered client request (proxy.Recorder).
func (d *Dashboard) Request(_ string, _ balancer.Reason, code int) {
	now := d.now()
	d.mu.Lock()
	s := d.second(now)
	s.answered++
	if code >= 500 {
		s.serverErrors++
	}
	d.mu.Unlock()
}

// StreamError counts a response broken after its first byte (proxy.Recorder).
func (d *Dashboard) StreamError(string) {
	now := d.now()
	d.mu.Lock()
	d.second(now).streamErrors++
	d.mu.Unlock()
}

// Failover is part of proxy.Recorder; failovers show as decisions with
// attempt > 1.
func (d *Dashboard) Failover(string) {}

// Transitions records health transitions (for the page's event list).
func (d *Dashboard) Transitions(ts []balancer.Transition) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, t := range ts {
		at := t.At
		if at.IsZero() {
			at = d.now()
		}
		d.transitions[d.transNext] = Transition{At: at, Replica: t.Replica, From: t.From.String(),
			To: t.To.String(), Cause: t.Cause, CooldownSeconds: t.Cooldown.Seconds()}
		d.transNext = (d.transNext + 1) % len(d.transitions)
		d.transSeen++
	}
}

// ScrapeResult records a successful scrape's prefix-cache counters
// (scrape.Options.OnResult); the hit rate is their change over a minute.
func (d *Dashboard) ScrapeResult(name string, res scrape.Result, at time.Time) {
	if !res.PrefixCacheKnown {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.prefix[name]
	if n := len(s); n > 0 && res.PrefixCacheQueries < s[n-1].queries {
		s = s[:0] // the replica restarted: its counters began again
	}
	// Keep the samples of the last window, and the one just before it.
	cut := 0
	for cut < len(s)-1 && at.Sub(s[cut+1].at) >= hitRateWindow {
		cut++
	}
	s = append(s[cut:], hitSample{at: at, queries: res.PrefixCacheQueries, hits: res.PrefixCacheHits})
	d.prefix[name] = s
}
