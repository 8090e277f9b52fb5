package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/bench"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/workload"
)

// runBench is `llmlb bench` (SPEC s12): every policy on the same workload and
// fleet in virtual time, a table on stdout (or --json), an optional HTML
// report, and a progress line on stderr.
func runBench(ctx context.Context, args []string) error {
	return benchMain(ctx, args, os.Stdout, os.Stderr)
}

func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	def := balancer.DefaultConfig()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		wlName      = fs.String("workload", "", "synthetic workload: "+strings.Join(workload.Names(), ", ")+" (default agentic)")
		trace       = fs.String("trace", "", "replay a trace file instead (Mooncake or Qwen-Bailian JSONL, Azure or BurstGPT CSV)")
		traceFormat = fs.String("trace-format", "", "trace format: mooncake | bailian | azure | burstgpt (default from the file: .csv is burstgpt when its header has a \"Request tokens\" column, else azure; .jsonl is bailian when its first line has chat_id, else mooncake)")
		traceSpeed  = fs.Float64("trace-speed", 1, "trace time compression: 2 replays twice as fast")
		traceLimit  = fs.Int("trace-limit", 0, "replay only the trace's first N requests (0: all)")
		policies    = fs.String("policies", strings.Join(bench.AllPolicies, ","), "comma-separated policies to compare; a policy's parameters follow a colon, e.g. prefix-tree:cache_threshold=0.5,balance_abs=32,cost")
		replicas    = fs.Int("replicas", 4, "number of simulated replicas")
		profile     = fs.String("profile", engine.DefaultProfile, "engine profile of every replica")
		duration    = fs.Duration("duration", 30*time.Minute, "virtual time during which requests arrive")
		seed        = fs.Int64("seed", 1, "random seed (workload and balancer); same seed, same numbers")
		jsonOut     = fs.Bool("json", false, "print machine-readable results (JSON) on stdout instead of the table")
		htmlOut     = fs.String("html", "", "write a self-contained HTML report with SVG charts to this file")
		requestsOut = fs.String("requests", "", "write every routed request (policy, replica, prompt and cached tokens, TTFT, e2e) as CSV to this file")
		rate        = fs.Float64("rate", 0, "arrivals per second (new sessions for closed-loop workloads); 0 = the workload's default for --replicas")
		users       = fs.Int("users", 0, "closed-loop workloads: a fixed population of users instead of --rate")
		parallel    = fs.Int("parallel", 0, "policies simulated at once (default: number of CPUs)")
		balancers   = fs.Int("balancers", 1, "routing cores in front of the fleet, each request sent to one at random; with more than 1 every policy runs twice, with independent and with shared state (docs/SHARED_STATE.md)")
		shareDelay  = fs.Duration("share-delay", bench.DefaultShareDelay, "--balancers: time for a change of one balancer's pins or block index to reach the others")
		shareLoad   = fs.Bool("share-load", true, "--balancers: shared state includes in-flight loads (serve's state.share_load)")
		quiet       = fs.Bool("quiet", false, "no progress line on stderr")
		cpuProfile  = fs.String("cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")

		sessionTTL     = fs.Duration("session-ttl", def.Affinity.SessionTTL, "llmlb: idle TTL of session pins")
		prefixTTL      = fs.Duration("prefix-ttl", def.Affinity.PrefixTTL, "llmlb: idle TTL of prefix pins")
		sessionSlack   = fs.Float64("session-slack", def.Affinity.SessionSlack, "llmlb: a session pin is usable while running <= min_r + slack")
		prefixSlack    = fs.Float64("prefix-slack", def.Affinity.PrefixSlack, "llmlb: a prefix pin is usable while running <= min_r + slack")
		spillsToRebind = fs.Int("spills-to-rebind", def.Affinity.SpillsToRebind, "llmlb: consecutive spills that rebind a session pin")
		forceRebindGap = fs.Float64("force-rebind-gap", def.Affinity.ForceRebindGap, "llmlb: running(pin) - min_r that moves a pin at once")
		rebindRatio    = fs.Float64("rebind-ratio", def.Affinity.RebindRatio, "llmlb-warm: a session pin also holds while running(pin) < ratio * mean running (in requests)")
		tokenUnit      = fs.Int("token-unit", def.Load.TokenUnit, "estimated tokens that weigh 1.0 in-flight request")
	)
	var flaps []bench.Flap
	repeatedFlag(fs, "flap", "fault: `NAME:PERIOD` makes a replica alternate PERIOD up / PERIOD down (repeatable), e.g. replica-1:15s", bench.ParseFlap, &flaps)
	var slow []bench.Slow
	repeatedFlag(fs, "slow", "a slower replica: `NAME:FACTOR` makes every engine step of NAME take FACTOR (>= 1) times longer for the whole run (repeatable), e.g. replica-4:2", bench.ParseSlow, &slow)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmlb bench [--workload NAME | --trace FILE] [flags]\n\nCompares routing policies on a simulated fleet in virtual time (docs/BENCH.md).\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *wlName != "" && *trace != "" {
		return errors.New("--workload and --trace exclude each other")
	}
	if *replicas < 1 {
		return fmt.Errorf("--replicas %d: need at least 1", *replicas)
	}
	if *balancers < 1 {
		return fmt.Errorf("--balancers %d: need at least 1", *balancers)
	}
	if *shareDelay <= 0 {
		return fmt.Errorf("--share-delay %s: must be > 0", *shareDelay)
	}
	if len(benchSplitList(*policies)) == 0 {
		return errors.New("--policies: name at least one policy")
	}

	prof, err := engine.Lookup(*profile)
	if err != nil {
		return err
	}
	cfg := def
	cfg.Affinity.SessionTTL = *sessionTTL
	cfg.Affinity.PrefixTTL = *prefixTTL
	cfg.Affinity.SessionSlack = *sessionSlack
	cfg.Affinity.PrefixSlack = *prefixSlack
	cfg.Affinity.SpillsToRebind = *spillsToRebind
	cfg.Affinity.ForceRebindGap = *forceRebindGap
	cfg.Affinity.RebindRatio = *rebindRatio
	cfg.Load.TokenUnit = *tokenUnit
	cfg.Seed = uint64(*seed)
	if err := cfg.Validate(); err != nil {
		return err
	}

	opts := bench.Options{
		Policies: benchSplitList(*policies),
		Replicas: *replicas,
		Profile:  prof,
		Duration: *duration,
		Seed:     *seed,
		Routing:  cfg,
		Flaps:    flaps,
		Slow:     slow,
		Parallel: *parallel,

		Balancers:   *balancers,
		ShareDelay:  *shareDelay,
		NoShareLoad: !*shareLoad,
	}
	if !*quiet {
		opts.Progress = stderr
	}
	if *trace != "" {
		path, format := *trace, *traceFormat
		durationSet := false
		fs.Visit(func(f *flag.Flag) { durationSet = durationSet || f.Name == "duration" })
		topt := workload.TraceOptions{Speed: *traceSpeed, Limit: *traceLimit}
		if durationSet {
			topt.Duration = *duration
		}
		// Fail early on a bad file rather than once per policy; without
		// --duration the run lasts as long as the trace.
		wl, err := workload.OpenTrace(path, format, topt)
		if err != nil {
			return err
		}
		if sum, ok := workload.Summarize(wl); ok && !*quiet {
			fmt.Fprintf(stderr, "trace %s (%s): %d requests over %v", filepath.Base(path), sum.Format, sum.Requests, sum.Span.Round(time.Second))
			switch {
			case sum.Skipped == 1:
				fmt.Fprint(stderr, "; 1 row skipped (0 request tokens)")
			case sum.Skipped > 1:
				fmt.Fprintf(stderr, "; %d rows skipped (0 request tokens)", sum.Skipped)
			}
			fmt.Fprintln(stderr)
		}
		if !durationSet {
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
	} else {
		name := *wlName
		if name == "" {
			name = "agentic"
		}
		p := workload.Params{Seed: *seed, Duration: *duration, Rate: *rate, Users: *users, Replicas: *replicas}
		if _, err := workload.New(name, p); err != nil {
			return err
		}
		opts.Workload = name
		opts.NewWorkload = func() (workload.Workload, error) { return workload.New(name, p) }
	}

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// Open the output files before the run so a bad path fails at once.
	htmlFile, err := createOutput(*htmlOut)
	if err != nil {
		return err
	}
	defer htmlFile.Close()
	requestsFile, err := createOutput(*requestsOut)
	if err != nil {
		return err
	}
	defer requestsFile.Close()
	opts.KeepRequests = requestsFile != nil
	rep, err := bench.Run(ctx, opts)
	if err != nil {
		return err
	}
	if err := finishOutput(requestsFile, rep.WriteRequestsCSV); err != nil {
		return err
	}
	if err := finishOutput(htmlFile, rep.WriteHTML); err != nil {
		return err
	}
	if *jsonOut {
		return rep.WriteJSON(stdout)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if *htmlOut != "" {
		fmt.Fprintf(stdout, "report: %s\n", *htmlOut)
	}
	if *requestsOut != "" {
		fmt.Fprintf(stdout, "requests: %s\n", *requestsOut)
	}
	return nil
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
