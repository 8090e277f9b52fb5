package scrape

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/balancer"
)

// Sink receives scrape results. *balancer.Balancer satisfies it: a failed
// scrape feeds health (docs/ROUTING.md "Health"), a successful one feeds load and health.
type Sink interface {
	ObserveScrape(name string, snap balancer.Snapshot, err error, now time.Time) []balancer.Transition
	SetModels(name string, models []string)
}

// The routing core is the Sink of `llmlb serve`.
var _ Sink = (*balancer.Balancer)(nil)

// followUpSink is a Sink that may ask for a replica's next scrape soon,
// at Options.FollowUp rather than the interval.
type followUpSink interface {
	ScrapeSoon(name string, now time.Time) bool
}

var _ followUpSink = (*balancer.Balancer)(nil)

// Target is one replica to scrape.
type Target struct {
	Name   string
	URL    string
	APIKey string   // sent as a bearer token on scrapes when non-empty
	Models []string // declared in config: models are then not read from /v1/models
	// LivenessOnly scrapes a replica that exports no Prometheus metrics
	// (`metrics: none`) with the Fetcher's CheckLive instead of Fetch: a
	// live replica is a good scrape with an empty Snapshot, so health works
	// and its load is only what the balancer itself sent there.
	LivenessOnly bool
}

// Options configures a Scraper. Zero values take the defaults.
type Options struct {
	Interval       time.Duration // between scrapes of one replica (default 3s)
	ModelsInterval time.Duration // between /v1/models refreshes (default 30s)
	// Jitter spreads scrapes of different replicas apart: each wait is
	// Interval * (1 ± Jitter) (default 0.1; negative for none).
	Jitter float64
	// FollowUp is the wait before the next scrape when the sink asks for
	// one soon (a Sink with ScrapeSoon, such as *balancer.Balancer while
	// a replica whose limit is not known fills up and requests of several
	// priorities or tenants compete): default Interval/6.
	FollowUp time.Duration

	// OnTransitions is called with the health transitions a scrape caused
	// (for logging and metrics; called from the replica's goroutine).
	OnTransitions func([]balancer.Transition)
	// OnScrape is called after every scrape with its error (nil = ok) and
	// duration, for metrics.
	OnScrape func(name string, err error, took time.Duration)
	// OnResult is called after every successful scrape with its result
	// (the dashboard reads the prefix-cache counters from it).
	OnResult func(name string, res Result, at time.Time)
	// OnModels is called when a replica's learned model list changes.
	OnModels func(name string, models []string)
	// MaxModels bounds the models learned from one replica's /v1/models
	// (default DefaultMaxModels); the rest are dropped.
	MaxModels int
	// MaxModelNameBytes bounds a learned model id (default
	// DefaultMaxModelNameBytes); longer ids, and ids that are not UTF-8 or
	// hold control characters, are dropped.
	MaxModelNameBytes int
	// OnModelsDropped is called after every read of /v1/models with how
	// many models it dropped (0 included), for metrics.
	OnModelsDropped func(name string, dropped int)

	Logger *slog.Logger     // default slog.Default()
	Now    func() time.Time // default time.Now
}

// Defaults of the bounds on what a replica's /v1/models may teach: a
// real fleet serves a handful of models and at most hundreds of LoRA
// adapters, and clients may not ask for a model name longer than the
// request parser's 512 bytes anyway.
const (
	DefaultMaxModels         = 1000
	DefaultMaxModelNameBytes = 512
)

// Scraper is the scrape loop of `llmlb serve`: one goroutine per replica,
// started by Run and stopped by Run's context (or Remove). Replicas may be
// added and removed while it runs. EJECTED replicas keep being scraped.
type Scraper struct {
	fetch  Fetcher
	models ModelFetcher    // nil when fetch does not implement it
	live   LivenessChecker // nil when fetch does not implement it
	sink   Sink
	opt    Options

	mu      sync.Mutex
	targets map[string]*target
	runCtx  context.Context // non-nil while Run runs
	wg      sync.WaitGroup
}

type target struct {
	Target
	cancel context.CancelFunc // non-nil while its loop runs
	done   chan struct{}      // closed when its loop has returned
}

// New returns a Scraper with no replicas; it starts nothing until Run.
func New(f Fetcher, sink Sink, o Options) *Scraper {
	if o.Interval <= 0 {
		o.Interval = 3 * time.Second
	}
	if o.FollowUp <= 0 || o.FollowUp > o.Interval {
		o.FollowUp = o.Interval / 6
	}
	if o.ModelsInterval <= 0 {
		o.ModelsInterval = 30 * time.Second
	}
	if o.Jitter == 0 {
		o.Jitter = 0.1
	}
	if o.Jitter < 0 {
		o.Jitter = 0
	}
	o.Jitter = min(o.Jitter, 0.5)
	if o.MaxModels <= 0 {
		o.MaxModels = DefaultMaxModels
	}
	if o.MaxModelNameBytes <= 0 {
		o.MaxModelNameBytes = DefaultMaxModelNameBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	mf, _ := f.(ModelFetcher)
	lc, _ := f.(LivenessChecker)
	return &Scraper{fetch: f, models: mf, live: lc, sink: sink, opt: o, targets: make(map[string]*target)}
}

// Add registers a replica; while Run runs, its loop starts at once (the first
// scrape is immediate).
func (s *Scraper) Add(t Target) error {
	if t.Name == "" || t.URL == "" {
		return fmt.Errorf("scrape: replica needs a name and a URL (got %q, %q)", t.Name, t.URL)
	}
	if t.LivenessOnly && s.live == nil {
		return fmt.Errorf("scrape: replica %q is to be scraped for liveness only, which this Fetcher cannot do (no CheckLive)", t.Name)
	}
	t.Models = slices.Clone(t.Models)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.targets[t.Name]; ok {
		return fmt.Errorf("scrape: replica %q already added", t.Name)
	}
	tg := &target{Target: t}
	s.targets[t.Name] = tg
	if s.runCtx != nil {
		s.start(tg)
	}
	return nil
}

// Remove stops scraping a replica. It returns after the replica's loop has
// ended, so no ObserveScrape for name follows it; do not call it while
// holding a lock the Sink takes. It reports whether the replica was known.
func (s *Scraper) Remove(name string) bool {
	s.mu.Lock()
	tg, ok := s.targets[name]
	delete(s.targets, name)
	var cancel context.CancelFunc
	var done chan struct{}
	if ok {
		cancel, done = tg.cancel, tg.done
		tg.cancel = nil
	}
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if done != nil {
		<-done // also when Run's cancellation stopped the loop first
	}
	return ok
}

// Targets returns the registered replicas, sorted by name.
func (s *Scraper) Targets() []Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Target, 0, len(s.targets))
	for _, t := range s.targets {
		c := t.Target
		c.Models = slices.Clone(c.Models)
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Run scrapes every registered (and later added) replica until ctx is
// cancelled, then waits for all loops to end and returns nil. It is an error
// to call Run while another Run is running.
func (s *Scraper) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.runCtx != nil {
		s.mu.Unlock()
		return errors.New("scrape: Run is already running")
	}
	s.runCtx = ctx
	for _, tg := range s.targets {
		s.start(tg)
	}
	s.mu.Unlock()

	<-ctx.Done()

	s.mu.Lock()
	s.runCtx = nil
	for _, tg := range s.targets {
		if tg.cancel != nil {
			tg.cancel()
			tg.cancel = nil
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// start launches tg's loop; s.mu must be held and s.runCtx set.
func (s *Scraper) start(tg *target) {
	ctx, cancel := context.WithCancel(s.runCtx)
	tg.cancel = cancel
	tg.done = make(chan struct{})
	t := tg.Target
	done := tg.done
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		s.loop(ctx, t)
	}()
}

// loop scrapes one replica every Interval (with jitter) until ctx ends.
func (s *Scraper) loop(ctx context.Context, t Target) {
	ctx = WithAPIKey(ctx, t.APIKey)
	var st loopState
	timer := time.NewTimer(0) // first scrape at once
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		s.once(ctx, t, &st)
		if soon, ok := s.sink.(followUpSink); ok && soon.ScrapeSoon(t.Name, time.Now()) {
			timer.Reset(s.opt.FollowUp)
			continue
		}
		timer.Reset(s.wait())
	}
}

// loopState is what one replica's loop remembers between scrapes.
type loopState struct {
	scrapes    int
	failing    bool
	engine     string // the engine the last good scrape recognized
	lastModels []string
	modelsAt   time.Time // zero until the first successful /v1/models
	// modelsWarned: the replica's model list was already logged as beyond
	// the bounds (once per replica).
	modelsWarned bool
}

// once performs one scrape of t and feeds the sink.
func (s *Scraper) once(ctx context.Context, t Target, st *loopState) {
	start := s.opt.Now()
	var res Result
	var err error
	if t.LivenessOnly {
		err = s.live.CheckLive(ctx, t.URL)
	} else {
		res, err = s.fetch.Fetch(ctx, t.URL)
	}
	if ctx.Err() != nil {
		return // stopped mid-scrape: says nothing about the replica
	}
	now := s.opt.Now()
	if s.opt.OnScrape != nil {
		s.opt.OnScrape(t.Name, err, now.Sub(start))
	}
	if err == nil && s.opt.OnResult != nil {
		s.opt.OnResult(t.Name, res, now)
	}
	trs := s.sink.ObserveScrape(t.Name, res.Snapshot, err, now)
	if len(trs) > 0 && s.opt.OnTransitions != nil {
		s.opt.OnTransitions(trs)
	}
	st.scrapes++
	switch {
	case err != nil && !st.failing:
		st.failing = true
		s.opt.Logger.Warn("scrape failing", "replica", t.Name, "url", t.URL, "err", err)
	case err != nil:
		s.opt.Logger.Debug("scrape failed", "replica", t.Name, "err", err)
	case st.failing:
		st.failing = false
		s.opt.Logger.Info("scrape recovered", "replica", t.Name, "url", t.URL)
	}
	if err == nil && st.scrapes == 1 && res.Legacy {
		s.opt.Logger.Info("replica exports pre-0.12 vLLM metric names", "replica", t.Name)
	}
	if err == nil && res.Engine != "" && res.Engine != st.engine {
		st.engine = res.Engine
		s.opt.Logger.Info("replica metrics recognized", "replica", t.Name, "engine", res.Engine)
	}
	if err == nil {
		s.refreshModels(ctx, t, st, now)
	}
}

// refreshModels learns t's models from /v1/models when they were not
// declared, at most every ModelsInterval once known.
func (s *Scraper) refreshModels(ctx context.Context, t Target, st *loopState, now time.Time) {
	if s.models == nil || len(t.Models) > 0 {
		return
	}
	if !st.modelsAt.IsZero() && now.Sub(st.modelsAt) < s.opt.ModelsInterval {
		return
	}
	models, err := s.models.FetchModels(ctx, t.URL)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		s.opt.Logger.Warn("reading /v1/models failed", "replica", t.Name, "err", err)
		return
	}
	st.modelsAt = now
	models, dropped := boundModels(models, s.opt.MaxModels, s.opt.MaxModelNameBytes)
	if s.opt.OnModelsDropped != nil {
		s.opt.OnModelsDropped(t.Name, dropped)
	}
	if dropped > 0 && !st.modelsWarned {
		st.modelsWarned = true
		s.opt.Logger.Warn("replica advertises models beyond the bounds; the rest are ignored",
			"replica", t.Name, "kept", len(models), "dropped", dropped,
			"max_models", s.opt.MaxModels, "max_model_name_bytes", s.opt.MaxModelNameBytes)
	}
	if st.lastModels != nil && slices.Equal(models, st.lastModels) {
		return
	}
	st.lastModels = models
	s.sink.SetModels(t.Name, slices.Clone(models))
	if s.opt.OnModels != nil {
		s.opt.OnModels(t.Name, slices.Clone(models))
	}
	s.opt.Logger.Info("replica models", "replica", t.Name, "models", models)
}

// boundModels keeps the first maxN model ids that are at most maxBytes
// long, valid UTF-8 and free of control characters, and counts the rest.
func boundModels(models []string, maxN, maxBytes int) (kept []string, dropped int) {
	kept = make([]string, 0, min(len(models), maxN))
	for _, m := range models {
		if len(kept) < maxN && len(m) <= maxBytes && utf8.ValidString(m) &&
			!strings.ContainsFunc(m, unicode.IsControl) {
			kept = append(kept, m)
			continue
		}
		dropped++
	}
	return kept, dropped
}

// wait returns the next delay: Interval * (1 ± Jitter).
func (s *Scraper) wait() time.Duration {
	d := float64(s.opt.Interval)
	if s.opt.Jitter > 0 {
		d *= 1 + s.opt.Jitter*(2*rand.Float64()-1)
	}
	return time.Duration(d)
}
