// Package bench is `llmlb bench` (docs/BENCH.md): a discrete-event driver that
// replays a workload against N simulated engines in virtual time, routed by the
// very same core as `llmlb serve` (package balancer), for several policies, and
// the report (terminal table, JSON, self-contained HTML with SVG charts).
//
// The driver starts no goroutines of its own per event: one policy run is one
// loop over an indexed min-heap of event sources (each engine's next event, each
// replica's next scrape, the balancer tick, the next arrival). Run executes
// several policy runs in parallel goroutines, all stopped by its context.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/workload"
)

// Epoch is the virtual clock's start: every run begins at this instant, so the
// same seed gives the same timestamps and the same numbers.
var Epoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// Defaults of the driver (scrapes every 3 s; the serve shell ticks
// the core every second).
const (
	DefaultScrapeInterval = 3 * time.Second
	DefaultTickInterval   = time.Second
	DefaultShareWindow    = 10 * time.Second
	DefaultMaxAttempts    = 3
	// Shared state between several balancers (--balancers): a change is
	// seen by the others DefaultShareDelay after it was made (a Redis round
	// trip on a loaded network, generously), and loads are published as
	// `serve` does (state.load_interval, state.load_ttl).
	DefaultShareDelay   = 50 * time.Millisecond
	DefaultLoadInterval = 250 * time.Millisecond
	DefaultLoadTTL      = 2 * time.Second
)

// AllPolicies are the policies compared by default: every registered one,
// in the registry's order (the baselines, llm-d's scheduler, the pin
// algorithm, its hybrid, then llmlb's own policy cost).
var AllPolicies = policy.Names()

// Flap is a fault: the replica alternates Period up and Period down (starting
// up), like simreplica's flap mode. While down its scrapes fail and it refuses
// new requests (the driver retries elsewhere, as the proxy does); requests it
// already holds keep running.
type Flap struct {
	Replica string
	Period  time.Duration
}

// down reports whether the flapping replica is down at offset at.
func (f Flap) down(at time.Duration) bool {
	if f.Period <= 0 {
		return false
	}
	return (at/f.Period)%2 == 1
}

// ParseFlap parses "replica-1:15s".
func ParseFlap(s string) (Flap, error) {
	name, period, ok := strings.Cut(s, ":")
	if !ok || name == "" {
		return Flap{}, fmt.Errorf("bench: flap %q: want NAME:PERIOD, e.g. replica-1:15s", s)
	}
	d, err := time.ParseDuration(period)
	if err != nil {
		return Flap{}, fmt.Errorf("bench: flap %q: %w", s, err)
	}
	if d <= 0 {
		return Flap{}, fmt.Errorf("bench: flap %q: period must be > 0", s)
	}
	return Flap{Replica: name, Period: d}, nil
}

// Slow is a slower replica: every engine step takes Factor times longer, for
// the whole run (an older or throttled GPU, a noisy neighbour; the engine's
// slowdown, like simreplica's slow mode). Factor is >= 1.
type Slow struct {
	Replica string
	Factor  float64
}

// ParseSlow parses "replica-4:2.5".
func ParseSlow(s string) (Slow, error) {
	name, factor, ok := strings.Cut(s, ":")
	if !ok || name == "" {
		return Slow{}, fmt.Errorf("bench: slow %q: want NAME:FACTOR, e.g. replica-4:2", s)
	}
	f, err := strconv.ParseFloat(factor, 64)
	if err != nil || !(f >= 1) || math.IsInf(f, 0) {
		return Slow{}, fmt.Errorf("bench: slow %q: factor %q, want a number >= 1 (2: every step twice as long)", s, factor)
	}
	return Slow{Replica: name, Factor: f}, nil
}

// WorkloadFactory returns a fresh workload; every policy run calls it once, so
// it must give the same sequence every time (same seed).
type WorkloadFactory func() (workload.Workload, error)

// Options configure a benchmark run.
type Options struct {
	Workload    string          // name for the report ("agentic", or the trace's file name)
	NewWorkload WorkloadFactory // required
	Policies    []string        // default AllPolicies
	Replicas    int             // number of engines (default 4)
	Profile     engine.Profile  // every engine's profile
	Duration    time.Duration   // arrivals are accepted in [0, Duration)
	// Drain is how long after Duration in-flight requests may still finish
	// (default Duration, at least 5 min); what is still running then is
	// counted as unfinished with its latency censored at the drain's end.
	Drain          time.Duration
	Seed           int64
	Routing        balancer.Config // Policy is set per run; zero value = balancer.DefaultConfig()
	Flaps          []Flap
	Slow           []Slow        // replicas slower than the profile
	ScrapeInterval time.Duration // default 3 s
	TickInterval   time.Duration // default 1 s
	ShareWindow    time.Duration // window of the imbalance index (default 10 s)
	MaxAttempts    int           // Select attempts per request when replicas refuse (default 3)
	Parallel       int           // policy runs at once (default GOMAXPROCS)
	// Balancers is the number of routing cores in front of the fleet
	// (default 1). With more than one, each arrival goes to one of them at
	// random (seeded), and every policy runs twice: independent cores, and
	// cores sharing state (package sharedstate's Bus) with ShareDelay.
	Balancers    int
	ShareDelay   time.Duration // default DefaultShareDelay
	LoadInterval time.Duration // default DefaultLoadInterval
	LoadTTL      time.Duration // default DefaultLoadTTL
	// NoShareLoad: shared runs share pins and the block index only, not
	// in-flight loads (serve's state.share_load: false).
	NoShareLoad bool
	Progress    io.Writer // progress line every ~1 s of wall time; nil = none
	// KeepRequests records every routed request in Result.RequestLog
	// (llmlb bench --requests): memory grows with the run's requests.
	KeepRequests bool
	// FlowControl runs every policy behind flow control, as `serve` with
	// flow_control enabled: each request is admitted by package
	// admission's Gate (one per routing core) and, while every replica is
	// full, waits in its queue and is dispatched late. A policy spec
	// ending its name in "+fc" ("cost+fc", "cost+fc:bounded_load=2") runs
	// that policy alone with it. Unsaturated, results are those without.
	FlowControl bool
	// Queue configures flow control's queue (flow_control.*); nil is
	// flowcontrol.DefaultConfig(). Enabled is implied.
	Queue *flowcontrol.Config
	// KVEvents feeds cost from the engines' own KV events (kvevents.go)
	// instead of its guess, each batch KVEventsLag late and lost with
	// probability KVEventsLoss (a lost batch clears that replica's entries
	// until its next events, as a subscriber without replay does).
	KVEvents     bool
	KVEventsLag  time.Duration
	KVEventsLoss float64
	// DefaultEngineSizes leaves policy cost's engine sizes
	// (routing.cost.max_num_seqs, batch_tokens) at the configuration's
	// defaults, as an operator who does not know them would, instead of
	// setting them to the profile's (llmlb bench --engine-sizes default).
	DefaultEngineSizes bool

	newEngine func() simEngine // tests: a stand-in engine model
}

func (o *Options) setDefaults() {
	if len(o.Policies) == 0 {
		o.Policies = AllPolicies
	}
	if o.Replicas == 0 {
		o.Replicas = 4
	}
	if o.Drain == 0 {
		o.Drain = max(o.Duration, 5*time.Minute)
	}
	if o.ScrapeInterval == 0 {
		o.ScrapeInterval = DefaultScrapeInterval
	}
	if o.TickInterval == 0 {
		o.TickInterval = DefaultTickInterval
	}
	if o.ShareWindow == 0 {
		o.ShareWindow = DefaultShareWindow
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.Routing.Load.TokenUnit == 0 && o.Routing.Affinity.SessionTTL == 0 {
		o.Routing = balancer.DefaultConfig() // unset: the serve defaults
	}
	if o.Parallel <= 0 {
		o.Parallel = runtime.GOMAXPROCS(0)
	}
	if o.Balancers == 0 {
		o.Balancers = 1
	}
	if o.ShareDelay == 0 {
		o.ShareDelay = DefaultShareDelay
	}
	if o.LoadInterval == 0 {
		o.LoadInterval = DefaultLoadInterval
	}
	if o.LoadTTL == 0 {
		o.LoadTTL = DefaultLoadTTL
	}
}

func (o *Options) validate() error {
	var errs []error
	if o.NewWorkload == nil {
		errs = append(errs, errors.New("bench: no workload"))
	}
	if o.Replicas < 1 {
		errs = append(errs, fmt.Errorf("bench: replicas: %d, must be >= 1", o.Replicas))
	}
	if o.Duration <= 0 {
		errs = append(errs, fmt.Errorf("bench: duration: %v, must be > 0", o.Duration))
	}
	if o.Drain < 0 || o.ScrapeInterval < 0 || o.TickInterval < 0 || o.ShareWindow < 0 || o.MaxAttempts < 0 {
		errs = append(errs, errors.New("bench: negative interval or attempts"))
	}
	if o.Balancers < 1 {
		errs = append(errs, fmt.Errorf("bench: balancers: %d, must be >= 1", o.Balancers))
	}
	if o.ShareDelay < 0 || o.LoadInterval <= 0 || o.LoadTTL <= 0 {
		errs = append(errs, errors.New("bench: share delay must be >= 0, load interval and TTL > 0"))
	}
	seen := map[string]bool{}
	if o.Queue != nil {
		if err := o.Queue.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("bench: %w", err))
		}
	}
	for _, p := range o.Policies {
		if seen[p] {
			errs = append(errs, fmt.Errorf("bench: policy %q listed twice", p))
		}
		seen[p] = true
		if _, err := o.routingFor(p); err != nil {
			errs = append(errs, fmt.Errorf("bench: policy %q: %w", p, err))
		}
	}
	for _, f := range o.Flaps {
		if _, ok := replicaIndex(f.Replica, o.Replicas); !ok {
			errs = append(errs, fmt.Errorf("bench: flap: unknown replica %q (replicas are replica-1..replica-%d)", f.Replica, o.Replicas))
		}
	}
	slow := make(map[string]bool)
	for _, f := range o.Slow {
		if _, ok := replicaIndex(f.Replica, o.Replicas); !ok {
			errs = append(errs, fmt.Errorf("bench: slow: unknown replica %q (replicas are replica-1..replica-%d)", f.Replica, o.Replicas))
		}
		if !(f.Factor >= 1) || math.IsInf(f.Factor, 0) {
			errs = append(errs, fmt.Errorf("bench: slow: %s: factor must be a number >= 1, got %v", f.Replica, f.Factor))
		}
		if slow[f.Replica] {
			errs = append(errs, fmt.Errorf("bench: slow: %s given twice", f.Replica))
		}
		slow[f.Replica] = true
	}
	return errors.Join(errs...)
}

// routingFor is the routing configuration of one policy spec ("name" or
// "name:key=value,..."): opts.Routing with the spec's parameters applied.
func (o *Options) routingFor(spec string) (balancer.Config, error) {
	cfg := o.Routing
	spec, _ = cutFlowControl(spec)
	name, params, err := policy.ParseSpec(spec)
	if err != nil {
		return cfg, err
	}
	set := cfg.Settings.WithDefaults()
	// What an operator configures for policy cost: the replicas' vLLM
	// scheduler limits (the spec's parameters may still override them).
	if o.Profile.MaxNumBatchedTokens > 0 && o.Profile.MaxNumSeqs > 0 && !o.DefaultEngineSizes {
		set.Cost.BatchTokens, set.Cost.MaxNumSeqs = o.Profile.MaxNumBatchedTokens, o.Profile.MaxNumSeqs
	}
	if err := set.Apply(name, params); err != nil {
		return cfg, err
	}
	cfg.Policy, cfg.Settings = name, set
	return cfg, nil
}

// FlowControlSuffix ends a policy's name in a spec to run it behind flow
// control: "cost+fc", "cost+fc:bounded_load=2".
const FlowControlSuffix = "+fc"

// cutFlowControl returns spec without FlowControlSuffix and whether it had
// it.
func cutFlowControl(spec string) (string, bool) {
	name, params, hasParams := strings.Cut(strings.TrimSpace(spec), ":")
	name, fc := strings.CutSuffix(name, FlowControlSuffix)
	if hasParams {
		name += ":" + params
	}
	return name, fc
}

// queueConfig is flow control's configuration for the runs that use it.
func (o *Options) queueConfig() flowcontrol.Config {
	cfg := flowcontrol.DefaultConfig()
	if o.Queue != nil {
		cfg = *o.Queue
	}
	cfg.Enabled = true
	return cfg
}

// replicaName is the name of engine i (0-based): replica-1, replica-2, ...
func replicaName(i int) string { return fmt.Sprintf("replica-%d", i+1) }

// replicaIndex is the inverse of replicaName.
func replicaIndex(name string, n int) (int, bool) {
	var k int
	if _, err := fmt.Sscanf(name, "replica-%d", &k); err != nil || k < 1 || k > n || replicaName(k-1) != name {
		return 0, false
	}
	return k - 1, true
}

// Run runs every policy of opts on fresh engines, a fresh balancer and a fresh
// workload, up to opts.Parallel at once, and returns the report with results
// in the order of opts.Policies. Cancelling ctx stops all runs; Run then
// returns ctx's error.
func Run(ctx context.Context, opts Options) (*Report, error) {
	opts.setDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var runs []*run
	for _, p := range opts.Policies {
		if opts.Balancers == 1 {
			runs = append(runs, &run{opts: &opts, policy: p, label: p})
			continue
		}
		for _, shared := range []bool{false, true} {
			label := RunLabel(p, opts.Balancers, shared, !opts.NoShareLoad)
			runs = append(runs, &run{opts: &opts, policy: p, shared: shared, label: label})
		}
	}
	results := make([]Result, len(runs))
	errs := make([]error, len(runs))

	var wg sync.WaitGroup
	sem := make(chan struct{}, opts.Parallel)
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				errs[i] = ctx.Err()
				return
			}
			defer func() { <-sem }()
			res, err := r.execute(ctx)
			if err != nil {
				errs[i] = fmt.Errorf("bench: policy %s: %w", r.label, err)
				cancel() // one failure stops the others
				return
			}
			results[i] = res
		}()
	}

	progressDone := make(chan struct{})
	if opts.Progress != nil {
		go func() {
			defer close(progressDone)
			reportProgress(ctx, opts.Progress, runs, opts.Duration)
		}()
	} else {
		close(progressDone)
	}
	wg.Wait()
	cancel()
	<-progressDone

	// Report the failure that stopped the run rather than the cancellations
	// it caused in the other policies.
	for _, e := range errs {
		if e != nil && !errors.Is(e, context.Canceled) {
			return nil, e
		}
	}
	for _, e := range errs {
		if e != nil {
			return nil, e // cancelled: one line is enough
		}
	}
	return &Report{
		Workload:        opts.Workload,
		Replicas:        opts.Replicas,
		Profile:         opts.Profile.Name,
		DurationSeconds: opts.Duration.Seconds(),
		Seed:            opts.Seed,
		Balancers:       opts.Balancers,
		Flaps:           flapStrings(opts.Flaps),
		Slow:            slowStrings(opts.Slow),
		Results:         results,
	}, nil
}

func flapStrings(fs []Flap) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Replica+":"+f.Period.String())
	}
	return out
}

func slowStrings(ss []Slow) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Replica+":"+strconv.FormatFloat(s.Factor, 'g', -1, 64))
	}
	return out
}

// reportProgress writes one status line (carriage-return updated) about every
// second of wall time until ctx is done.
func reportProgress(ctx context.Context, w io.Writer, runs []*run, total time.Duration) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(w, "\r%s\n", progressLine(runs, total, time.Since(start)))
			return
		case <-t.C:
			fmt.Fprintf(w, "\r%s", progressLine(runs, total, time.Since(start)))
		}
	}
}

func progressLine(runs []*run, total time.Duration, wall time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "bench %4.0fs wall |", wall.Seconds())
	for _, r := range runs {
		done := time.Duration(r.progress.Load())
		fmt.Fprintf(&b, " %s %s/%s", r.label, shortDur(min(done, total)), shortDur(total))
		if r.finished.Load() {
			b.WriteString(" done")
		}
		b.WriteString(" |")
	}
	return b.String()
}

func shortDur(d time.Duration) string {
	d = d.Truncate(time.Second)
	if d >= time.Hour {
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
}

// progress and finished are updated by the run's goroutine and read by the
// progress printer.
type runProgress struct {
	progress atomic.Int64 // virtual time done (ns since Epoch)
	finished atomic.Bool
}

// RunLabel names one run of a policy with several balancers: "cost x4
// independent", "cost x4 shared" or, without the loads, "cost x4
// shared-no-load".
func RunLabel(policy string, balancers int, shared, load bool) string {
	mode := "independent"
	switch {
	case shared && load:
		mode = "shared"
	case shared:
		mode = "shared-no-load"
	}
	return fmt.Sprintf("%s x%d %s", policy, balancers, mode)
}
