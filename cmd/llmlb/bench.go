package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/bench"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/workload"
)

// runBench is `llmlb bench`: every policy on the same workload and fleet in
// virtual time, a table on stdout (or --json), an optional HTML report, and
// a progress line on stderr.
func runBench(ctx context.Context, args []string) error {
	return benchMain(ctx, args, os.Stdout, os.Stderr)
}

// benchMain is runBench with its output streams given, so that tests can
// read what it prints.
func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o benchOptions
	if err := o.parse(args, stderr); err != nil {
		return err
	}
	opts, err := o.runOptions(stderr)
	if err != nil {
		return err
	}
	return o.run(ctx, opts, stdout)
}

// benchOptions are the flags of `llmlb bench`.
type benchOptions struct {
	workload string
	// enginePriority: engines schedule by priority, flow control forwards it.
	enginePriority bool
	trace          string
	traceFormat    string
	traceSpeed     float64
	traceLimit     int
	policies       string
	replicas       int
	profile        string
	duration       time.Duration
	durationSet    bool // --duration was given: it also cuts a trace's replay
	seed           int64
	json           bool
	html           string
	requests       string
	rate           float64
	users          int
	parallel       int
	balancers      int
	shareDelay     time.Duration
	shareLoad      bool
	kvEvents       benchKVEvents
	quiet          bool
	cpuProfile     string
	engineSizes    string // known | default: what cost is told of the engines
	maxNumSeqs     int    // overrides the profile's running slots when > 0
	partial        int    // overrides the profile's prefill model when > 0
	flaps          []bench.Flap
	slow           []bench.Slow

	speed       float64
	priorityMix string
	flowControl string
	queue       flowcontrol.Config

	// routing starts as the balancer's defaults; the llmlb policies'
	// tunables are set on it directly by their flags.
	routing balancer.Config
}

// benchFlags defines the flags of `llmlb bench` on o, with its help and
// errors on out.
func benchFlags(o *benchOptions, out io.Writer) *flag.FlagSet {
	o.routing = balancer.DefaultConfig()
	def := o.routing
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&o.workload, "workload", "", "synthetic workload: "+strings.Join(workload.Names(), ", ")+" (default agentic)")
	fs.StringVar(&o.trace, "trace", "", "replay a trace file instead (Mooncake or Qwen-Bailian JSONL, Azure or BurstGPT CSV)")
	fs.StringVar(&o.traceFormat, "trace-format", "", "trace format: mooncake | bailian | azure | burstgpt (default from the file: .csv is burstgpt when its header has a \"Request tokens\" column, else azure; .jsonl is bailian when its first line has chat_id, else mooncake)")
	fs.Float64Var(&o.traceSpeed, "trace-speed", 1, "trace time compression: 2 replays twice as fast")
	fs.IntVar(&o.traceLimit, "trace-limit", 0, "replay only the trace's first N requests (0: all)")
	fs.StringVar(&o.policies, "policies", strings.Join(bench.AllPolicies, ","), "comma-separated policies to compare; a policy's parameters follow a colon, e.g. prefix-tree:cache_threshold=0.5,balance_abs=32,cost")
	fs.IntVar(&o.replicas, "replicas", 4, "number of simulated replicas")
	fs.IntVar(&o.maxNumSeqs, "max-num-seqs", 0, "every replica's running slots (vLLM's --max-num-seqs; 0 = the profile's)")
	fs.IntVar(&o.partial, "partial-prefills", 0, "prefills that share a step's token budget: 1 serial (vLLM's default), more parallel (0 = the profile's)")
	fs.StringVar(&o.engineSizes, "engine-sizes", "known", "known: policy cost is configured with the profile's max_num_seqs and batch_tokens, as by an operator who knows them; default: they stay at routing.cost's defaults")
	fs.StringVar(&o.profile, "profile", engine.DefaultProfile, "engine profile of every replica")
	fs.DurationVar(&o.duration, "duration", 30*time.Minute, "virtual time during which requests arrive")
	fs.Int64Var(&o.seed, "seed", 1, "random seed (workload and balancer); same seed, same numbers")
	fs.BoolVar(&o.json, "json", false, "print machine-readable results (JSON) on stdout instead of the table")
	fs.StringVar(&o.html, "html", "", "write a self-contained HTML report with SVG charts to this file")
	fs.StringVar(&o.requests, "requests", "", "write every routed request (policy, replica, prompt and cached tokens, TTFT, e2e) as CSV to this file")
	fs.Float64Var(&o.rate, "rate", 0, "arrivals per second (new sessions for closed-loop workloads); 0 = the workload's default for --replicas")
	fs.IntVar(&o.users, "users", 0, "closed-loop workloads: a fixed population of users instead of --rate")
	fs.IntVar(&o.parallel, "parallel", 0, "policies simulated at once (default: number of CPUs)")
	fs.IntVar(&o.balancers, "balancers", 1, "routing cores in front of the fleet, each request sent to one at random; with more than 1 every policy runs twice, with independent and with shared state (docs/SHARED_STATE.md)")
	fs.DurationVar(&o.shareDelay, "share-delay", bench.DefaultShareDelay, "--balancers: time for a change of one balancer's pins or block index to reach the others")
	o.kvEvents.flags(fs)
	fs.BoolVar(&o.shareLoad, "share-load", true, "--balancers: shared state includes in-flight loads (serve's state.share_load)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress line on stderr")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	fs.Float64Var(&o.speed, "speed", 1, "overload: multiplies the arrival rate (--rate or the workload's default) or a trace's replay speed (on top of --trace-speed); 2 offers twice the load")
	fs.StringVar(&o.priorityMix, "priority-mix", "", "`HIGH,SHED`: give that share of requests priority 1 and that share priority -1 (sheddable), the rest 0; a session's requests share one class, e.g. 0.1,0.2")

	o.queue = flowcontrol.DefaultConfig()
	fs.StringVar(&o.flowControl, "flow-control", "off", "on: every policy runs behind flow control (serve's flow_control: requests wait in the balancer while every replica is full); off: none, except policies named NAME+fc in --policies")
	fs.DurationVar(&o.queue.MaxQueueTime, "max-queue-time", o.queue.MaxQueueTime, "flow control: longest wait in the queue before a 429 queue_timeout (flow_control.max_queue_time)")
	fs.DurationVar(&o.queue.LIFOAfter, "lifo-after", o.queue.LIFOAfter, "flow control: a tenant's newest request goes first once its oldest has waited this long; 0 keeps first come, first served (flow_control.lifo_after)")
	fs.DurationVar(&o.queue.StandingQueueTime, "standing-queue-time", o.queue.StandingQueueTime, "flow control: once the queue has held requests without a break for --standing-after, the longest wait before a 429 queue_timeout; 0 = max-queue-time always (flow_control.standing_queue_time)")
	fs.DurationVar(&o.queue.StandingAfter, "standing-after", o.queue.StandingAfter, "flow control: how long the queue holds requests without a break before --standing-queue-time applies (flow_control.standing_after)")
	fs.IntVar(&o.queue.LocalityScan, "locality-scan", o.queue.LocalityScan, "flow control: held requests of a flow looked at per dispatch for one whose cached prefix is on a replica with room; 0 takes them in turn (flow_control.locality_scan)")
	fs.DurationVar(&o.queue.LocalityWait, "locality-wait", o.queue.LocalityWait, "flow control: longest a held request is passed over for locality (flow_control.locality_wait)")
	fs.BoolVar(&o.enginePriority, "engine-priority", false, "engines schedule their waiting queue by priority (vLLM's --scheduling-policy priority) and flow control writes each request's priority into it (flow_control.engine_priority)")
	fs.IntVar(&o.queue.MaxQueued, "max-queued", o.queue.MaxQueued, "flow control: most requests queued (flow_control.max_queued)")
	fs.IntVar(&o.queue.Tenant.MaxConcurrent, "tenant-max-concurrent", 0, "flow control: each tenant's requests queued or running at once, 0 = no limit (flow_control.tenant_max_concurrent)")
	fs.IntVar(&o.queue.Tenant.TokensPerMinute, "tenant-tokens-per-minute", 0, "flow control: each tenant's estimated tokens a minute, 0 = no limit (flow_control.tenant_tokens_per_minute)")
	fs.IntVar(&o.routing.Saturation.MaxRunning, "max-running", def.Saturation.MaxRunning, "flow control: every replica's running-slot limit (routing.saturation.max_running); 0 learns each replica's from its scrapes")
	fs.Float64Var(&o.routing.Saturation.KVFullUsage, "kv-full-usage", def.Saturation.KVFullUsage, "flow control: KV cache usage (0-1) from which requests waiting in a replica's queue wait for memory, making it full; 0 = 0.75 (routing.saturation.kv_full_usage)")
	fs.DurationVar(&o.routing.Saturation.PrefillBacklog, "prefill-backlog", def.Saturation.PrefillBacklog, "flow control: a replica with requests waiting in its own queue is full while the prefill llmlb sent it takes longer than this to compute; 0 = 5s, negative = off (routing.saturation.prefill_backlog)")
	fs.Float64Var(&o.routing.Saturation.KVCommit, "kv-commit", def.Saturation.KVCommit, "flow control: a replica is full while the KV llmlb's requests there hold or will hold (computed prompt tokens plus half the mean output each) reaches this share of its KV capacity; 0 = 1, negative = off (routing.saturation.kv_commit)")
	fs.Float64Var(&o.routing.Saturation.KVReserveShare, "kv-reserve-share", def.Saturation.KVReserveShare, "flow control: share of the KV --kv-commit lets llmlb's requests commit on each replica that a lower priority, while a higher one has requests outstanding, or a tenant over its fair share may not take; 0 = a third, negative = none (routing.saturation.kv_reserve_share)")
	fs.DurationVar(&o.routing.Saturation.LowerPrefillBacklog, "lower-prefill-backlog", def.Saturation.LowerPrefillBacklog, "flow control: while a higher priority has requests outstanding, a lower one finds a replica full once the prefill llmlb sent it and has not seen done takes this long to compute; 0 = 2s, negative = off (routing.saturation.lower_prefill_backlog)")
	fs.Float64Var(&o.routing.Saturation.ReserveShare, "reserve-share", def.Saturation.ReserveShare, "flow control: share of each replica's running limit a tenant over its fair share may not take; 0 = 0.05, negative = none (routing.saturation.reserve_share)")
	fs.IntVar(&o.routing.Saturation.Headroom, "headroom", def.Saturation.Headroom, "flow control: requests a replica may hold waiting in its own queue past its running limit (routing.saturation.headroom)")

	fs.DurationVar(&o.routing.Affinity.SessionTTL, "session-ttl", def.Affinity.SessionTTL, "llmlb: idle TTL of session pins")
	fs.DurationVar(&o.routing.Affinity.PrefixTTL, "prefix-ttl", def.Affinity.PrefixTTL, "llmlb: idle TTL of prefix pins")
	fs.Float64Var(&o.routing.Affinity.SessionSlack, "session-slack", def.Affinity.SessionSlack, "llmlb: a session pin is usable while running <= min_r + slack")
	fs.Float64Var(&o.routing.Affinity.PrefixSlack, "prefix-slack", def.Affinity.PrefixSlack, "llmlb: a prefix pin is usable while running <= min_r + slack")
	fs.IntVar(&o.routing.Affinity.SpillsToRebind, "spills-to-rebind", def.Affinity.SpillsToRebind, "llmlb: consecutive spills that rebind a session pin")
	fs.Float64Var(&o.routing.Affinity.ForceRebindGap, "force-rebind-gap", def.Affinity.ForceRebindGap, "llmlb: running(pin) - min_r that moves a pin at once")
	fs.Float64Var(&o.routing.Affinity.RebindRatio, "rebind-ratio", def.Affinity.RebindRatio, "llmlb-warm: a session pin also holds while running(pin) < ratio * mean running (in requests)")
	fs.IntVar(&o.routing.Load.TokenUnit, "token-unit", def.Load.TokenUnit, "estimated tokens that weigh 1.0 in-flight request")

	repeatedFlag(fs, "flap", "fault: `NAME:PERIOD` makes a replica alternate PERIOD up / PERIOD down (repeatable), e.g. replica-1:15s", bench.ParseFlap, &o.flaps)
	repeatedFlag(fs, "slow", "a slower replica: `NAME:FACTOR` makes every engine step of NAME take FACTOR (>= 1) times longer for the whole run (repeatable), e.g. replica-4:2", bench.ParseSlow, &o.slow)
	fs.Usage = func() {
		fmt.Fprintln(out, "usage: llmlb bench [--workload NAME | --trace FILE] [flags]\n\nCompares routing policies on a simulated fleet in virtual time (docs/BENCH.md).\n\nflags:")
		fs.PrintDefaults()
	}
	return fs
}

// parse reads the command line into o and checks the flags that need no
// lookup; errors and help go to stderr.
func (o *benchOptions) parse(args []string, stderr io.Writer) error {
	fs := benchFlags(o, stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fs.Visit(func(f *flag.Flag) { o.durationSet = o.durationSet || f.Name == "duration" })
	return o.validate()
}

// validate reports the first flag out of range, before anything is looked
// up or read.
func (o *benchOptions) validate() error {
	if o.workload != "" && o.trace != "" {
		return errors.New("--workload and --trace exclude each other")
	}
	if o.replicas < 1 {
		return fmt.Errorf("--replicas %d: need at least 1", o.replicas)
	}
	if o.balancers < 1 {
		return fmt.Errorf("--balancers %d: need at least 1", o.balancers)
	}
	if o.shareDelay <= 0 {
		return fmt.Errorf("--share-delay %s: must be > 0", o.shareDelay)
	}
	if err := o.kvEvents.validate(); err != nil {
		return err
	}
	if len(benchSplitList(o.policies)) == 0 {
		return errors.New("--policies: name at least one policy")
	}
	if !(o.speed > 0) || math.IsInf(o.speed, 0) {
		return fmt.Errorf("--speed %v: must be a number > 0", o.speed)
	}
	if o.flowControl != "on" && o.flowControl != "off" {
		return fmt.Errorf("--flow-control %q: on or off", o.flowControl)
	}
	if _, _, err := o.mix(); err != nil {
		return err
	}
	return o.queue.Validate()
}

// mix parses --priority-mix: the shares of high-priority and sheddable
// requests (0, 0 when unset).
func (o *benchOptions) mix() (high, shed float64, err error) {
	if o.priorityMix == "" {
		return 0, 0, nil
	}
	h, s, ok := strings.Cut(o.priorityMix, ",")
	if ok {
		high, err = strconv.ParseFloat(strings.TrimSpace(h), 64)
		if err == nil {
			shed, err = strconv.ParseFloat(strings.TrimSpace(s), 64)
		}
	}
	if !ok || err != nil || !(high >= 0 && shed >= 0 && high+shed <= 1) {
		return 0, 0, fmt.Errorf("--priority-mix %q: want HIGH,SHED, two shares >= 0 summing to at most 1, e.g. 0.1,0.2", o.priorityMix)
	}
	return high, shed, nil
}

// runOptions builds the run the flags describe: the engine profile, the
// routing configuration and the workload, each checked here so that a bad
// value fails before any policy runs. A trace's summary goes to stderr.
func (o *benchOptions) runOptions(stderr io.Writer) (bench.Options, error) {
	prof, err := engine.Lookup(o.profile)
	if err != nil {
		return bench.Options{}, err
	}
	if o.maxNumSeqs < 0 || o.partial < 0 {
		return bench.Options{}, fmt.Errorf("--max-num-seqs and --partial-prefills must be >= 0, got %d and %d", o.maxNumSeqs, o.partial)
	}
	if o.maxNumSeqs > 0 {
		prof.MaxNumSeqs = o.maxNumSeqs
	}
	if o.partial > 0 {
		prof.MaxPartialPrefills = o.partial
	}
	prof.PriorityScheduling = o.enginePriority
	o.queue.EnginePriority = o.enginePriority
	if o.engineSizes != "known" && o.engineSizes != "default" {
		return bench.Options{}, fmt.Errorf("--engine-sizes: must be known or default, got %q", o.engineSizes)
	}
	cfg := o.routing
	cfg.Seed = uint64(o.seed)
	if err := cfg.Validate(); err != nil {
		return bench.Options{}, err
	}

	opts := bench.Options{
		Policies: benchSplitList(o.policies),
		Replicas: o.replicas,
		Profile:  prof,
		Duration: o.duration,
		Seed:     o.seed,
		Routing:  cfg,
		Flaps:    o.flaps,
		Slow:     o.slow,
		Parallel: o.parallel,

		DefaultEngineSizes: o.engineSizes == "default",

		Balancers:   o.balancers,
		ShareDelay:  o.shareDelay,
		NoShareLoad: !o.shareLoad,

		KVEvents:     o.kvEvents.on,
		KVEventsLag:  o.kvEvents.lag,
		KVEventsLoss: o.kvEvents.loss,

		FlowControl: o.flowControl == "on",
		Queue:       &o.queue,
	}
	if !o.quiet {
		opts.Progress = stderr
	}
	if o.trace != "" {
		err = o.traceWorkload(&opts, stderr)
	} else {
		err = o.syntheticWorkload(&opts)
	}
	if err != nil {
		return bench.Options{}, err
	}
	if high, shed, _ := o.mix(); high > 0 || shed > 0 {
		inner := opts.NewWorkload
		opts.NewWorkload = func() (workload.Workload, error) {
			w, err := inner()
			if err != nil {
				return nil, err
			}
			return workload.WithPriorities(w, o.seed, high, shed)
		}
	}
	return opts, nil
}

// traceWorkload sets opts to replay the trace of --trace, read once here.
func (o *benchOptions) traceWorkload(opts *bench.Options, stderr io.Writer) error {
	path, format := o.trace, o.traceFormat
	topt := workload.TraceOptions{Speed: o.traceSpeed * o.speed, Limit: o.traceLimit}
	if o.durationSet {
		topt.Duration = o.duration
	}
	// Fail early on a bad file rather than once per policy; without
	// --duration the run lasts as long as the trace.
	wl, err := workload.OpenTrace(path, format, topt)
	if err != nil {
		return err
	}
	if sum, ok := workload.Summarize(wl); ok && !o.quiet {
		printTraceSummary(stderr, path, sum)
	}
	if !o.durationSet {
		opts.Duration = traceSpan(wl)
	}
	opts.Workload = filepath.Base(path)
	// Read once: each policy replays the same records (a trace of
	// millions of rows was read and held once per policy).
	opts.NewWorkload = func() (workload.Workload, error) {
		if w, ok := workload.Replay(wl); ok {
			return w, nil
		}
		return workload.OpenTrace(path, format, topt)
	}
	return nil
}

// printTraceSummary tells what the trace holds before the run, so that a
// wrong file or format shows at once.
func printTraceSummary(stderr io.Writer, path string, sum workload.TraceSummary) {
	fmt.Fprintf(stderr, "trace %s (%s): %d requests over %v", filepath.Base(path), sum.Format, sum.Requests, sum.Span.Round(time.Second))
	switch {
	case sum.Skipped == 1:
		fmt.Fprint(stderr, "; 1 row skipped (0 request tokens)")
	case sum.Skipped > 1:
		fmt.Fprintf(stderr, "; %d rows skipped (0 request tokens)", sum.Skipped)
	}
	fmt.Fprintln(stderr)
}

// syntheticWorkload sets opts to generate the workload of --workload
// (agentic when none is named), generated once here so that a bad name or
// parameter fails before the run.
func (o *benchOptions) syntheticWorkload(opts *bench.Options) error {
	name := o.workload
	if name == "" {
		name = "agentic"
	}
	p := workload.Params{Seed: o.seed, Duration: o.duration, Rate: o.rate, Users: o.users, Replicas: o.replicas, Speed: o.speed}
	if _, err := workload.New(name, p); err != nil {
		return err
	}
	opts.Workload = name
	opts.NewWorkload = func() (workload.Workload, error) { return workload.New(name, p) }
	return nil
}

// run runs the benchmark of opts, writes the files asked for and reports
// on stdout.
func (o *benchOptions) run(ctx context.Context, opts bench.Options, stdout io.Writer) error {
	stopProfile, err := startCPUProfile(o.cpuProfile)
	if err != nil {
		return err
	}
	defer stopProfile()
	// Open the output files before the run so a bad path fails at once.
	htmlFile, err := createOutput(o.html)
	if err != nil {
		return err
	}
	defer htmlFile.Close()
	requestsFile, err := createOutput(o.requests)
	if err != nil {
		return err
	}
	defer requestsFile.Close()
	opts.KeepRequests = requestsFile != nil
	rep, err := bench.Run(ctx, opts)
	if err != nil {
		return err
	}
	if o.speed != 1 {
		rep.Speed = o.speed
	}
	rep.PriorityMix = o.priorityMix
	if err := finishOutput(requestsFile, rep.WriteRequestsCSV); err != nil {
		return err
	}
	if err := finishOutput(htmlFile, rep.WriteHTML); err != nil {
		return err
	}
	return o.report(rep, stdout)
}

// report prints the results on stdout: JSON, or the table and where the
// files asked for were written.
func (o *benchOptions) report(rep *bench.Report, stdout io.Writer) error {
	if o.json {
		return rep.WriteJSON(stdout)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if o.html != "" {
		fmt.Fprintf(stdout, "report: %s\n", o.html)
	}
	if o.requests != "" {
		fmt.Fprintf(stdout, "requests: %s\n", o.requests)
	}
	return nil
}

// startCPUProfile profiles the CPU into the file at path until the returned
// stop is called; no path, no profile (and a stop that does nothing).
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// createOutput creates the file at path, or returns nil for no path. A nil
// *os.File's Close is a harmless error, so it may be deferred either way.
func createOutput(path string) (*os.File, error) {
	if path == "" {
		return nil, nil
	}
	return os.Create(path)
}

// finishOutput writes f with write and closes it, reporting either's error;
// a nil f is no output.
func finishOutput(f *os.File, write func(io.Writer) error) error {
	if f == nil {
		return nil
	}
	if err := write(f); err != nil {
		return err
	}
	return f.Close()
}

// repeatedFlag defines a flag that may be given several times, each value
// parsed by parse and appended to into.
func repeatedFlag[T any](fs *flag.FlagSet, name, usage string, parse func(string) (T, error), into *[]T) {
	fs.Func(name, usage, func(s string) error {
		v, err := parse(s)
		if err != nil {
			return err
		}
		*into = append(*into, v)
		return nil
	})
}

// traceSpan is the time from the start to just after the last arrival,
// rounded up to a whole minute.
func traceSpan(wl workload.Workload) time.Duration {
	var last time.Duration
	if sum, ok := workload.Summarize(wl); ok {
		last = sum.Span
	} else { // any other workload: run through its arrivals
		for {
			at, ok := wl.Peek()
			if !ok {
				break
			}
			last = at
			wl.Pop()
		}
	}
	d := last + time.Second
	if d%time.Minute != 0 {
		d = d.Truncate(time.Minute) + time.Minute
	}
	return d
}

func benchSplitList(s string) []string { return policy.SplitSpecs(s) }
