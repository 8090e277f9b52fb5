package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/modeltok"
	"github.com/llmlb/llmlb/internal/simreplica"
)

// faultFlags collects repeated --fault values: "MODE[:k=v,...]" for every
// replica, or "NAME=MODE[:k=v,...]" for one (names are sim-1..sim-N).
type faultFlags []string

func (f *faultFlags) String() string     { return strings.Join(*f, " ") }
func (f *faultFlags) Set(v string) error { *f = append(*f, v); return nil }

// runSim runs N simulated vLLM replicas until ctx is cancelled (Ctrl-C).
func runSim(ctx context.Context, args []string) error {
	return simMain(ctx, args, os.Stdout, os.Stderr)
}

func simMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8001", "address of the first replica; the others take the following ports")
	replicas := fs.Int("replicas", 1, "number of replicas")
	profile := fs.String("profile", engine.DefaultProfile, "engine profile ("+strings.Join(engine.ProfileNames(), ", ")+")")
	model := fs.String("model", "sim-model", "served model id")
	legacy := fs.Bool("legacy-metrics", false, "emit pre-0.12 vLLM metric names (vllm:gpu_cache_usage_perc, vllm:gpu_prefix_cache_*)")
	controlOffset := fs.Int("control-offset", 1000, "each replica also serves /sim/fault on its port + this offset (usable while it refuses); 0 disables")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	maxSeqs := fs.Int("max-num-seqs", 0, "override the profile's running slots per replica (0 = the profile's)")
	partial := fs.Int("partial-prefills", 0, "prefills that share a step's token budget: 1 serial (vLLM's default), more parallel (0 = the profile's)")
	schedPolicy := fs.String("scheduling-policy", "fcfs", "the engines' waiting queue: fcfs (first come, first served; a request's non-zero priority is refused) or priority (the request's priority field, lower first), as vLLM's flag")
	kvTokens := fs.Int("kv-tokens", 0, "override the profile's KV-cache size in tokens per replica (0 = the profile's)")
	tokenizer := fs.String("tokenizer", "", "tokenize prompts with this model's own tokenizer (a model directory with tokenizer.json and its chat template, or a tokenizer.json), as a real engine does: blocks are then hashed as vLLM hashes them, from a random seed per replica, and KV events carry token ids; llmlb matches them with the same tokenizer under tokenizers[] (docs/KV_EVENTS.md)")
	var kvEvents simKVEvents
	kvEvents.flags(fs)
	var faults faultFlags
	fs.Var(&faults, "fault", "initial fault, repeatable: MODE[:k=v,...] for all replicas or NAME=MODE[:...] for one\n"+
		"(refuse, hang, error:rate=0.5,status=503, slow:factor=4, break:after_tokens=10, flap:period=15s)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmlb sim [flags]\n\nRuns simulated vLLM replicas (OpenAI API, /health, /version, /metrics) with fault injection:\n"+
			"  curl -X POST http://HOST:PORT+OFFSET/sim/fault -d '{\"mode\":\"refuse\"}'   (also on the main port unless it refuses)\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *maxSeqs < 0 || *kvTokens < 0 {
		return fmt.Errorf("--max-num-seqs and --kv-tokens must be >= 0, got %d and %d", *maxSeqs, *kvTokens)
	}
	if *schedPolicy != "fcfs" && *schedPolicy != "priority" {
		return fmt.Errorf("--scheduling-policy: must be fcfs or priority, got %q", *schedPolicy)
	}
	if *replicas < 1 {
		return fmt.Errorf("--replicas must be at least 1, got %d", *replicas)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	all, perReplica, err := parseFaultFlags(faults, *replicas)
	if err != nil {
		return err
	}
	var tok simreplica.Tokenizer
	if *tokenizer != "" {
		m, err := modeltok.Load(*tokenizer)
		if err != nil {
			return fmt.Errorf("--tokenizer: %w", err)
		}
		tok = m
	}
	fleet, err := simreplica.StartFleet(ctx, simreplica.FleetOptions{
		Replicas:      *replicas,
		Profile:       *profile,
		Model:         *model,
		Listen:        *listen,
		ControlOffset: *controlOffset,
		LegacyMetrics: *legacy,
		Fault:         all,
		Logger:        logger,
		MaxNumSeqs:    *maxSeqs,
		KVCacheTokens: *kvTokens,
		// The prefill model: serial or parallel.
		MaxPartialPrefills: *partial,
		PriorityScheduling: *schedPolicy == "priority",
		Tokenizer:          tok,
	})
	if err != nil {
		return err
	}
	for name, f := range perReplica {
		if err := fleet.Replica(name).SetFault(f); err != nil {
			fleet.Close()
			return err
		}
	}
	fmt.Fprintf(stdout, "llmlb sim: %d replica(s), profile %s, model %s\n", *replicas, *profile, *model)
	if *tokenizer != "" {
		fmt.Fprintf(stdout, "  tokenizer %s: blocks hashed as vLLM hashes them, from a random seed per replica; list it under tokenizers[] for model %s\n", *tokenizer, *model)
	}
	for _, r := range fleet.Replicas {
		line := fmt.Sprintf("  %s  %s", r.Name(), r.URL())
		if c := r.ControlURL(); c != "" {
			line += "  control " + c + "/sim/fault"
		}
		if f := r.Fault(); f.Mode != simreplica.None {
			line += "  fault " + f.String()
		}
		fmt.Fprintln(stdout, line)
	}
	if err := kvEvents.start(ctx, fleet, stdout); err != nil {
		fleet.Close()
		return err
	}
	fmt.Fprintln(stdout, "Ctrl-C stops.")
	<-ctx.Done()
	return fleet.Wait()
}

// parseFaultFlags splits --fault values into the fault for all replicas and
// per-replica overrides, checking names against sim-1..sim-N.
func parseFaultFlags(specs []string, n int) (simreplica.Fault, map[string]simreplica.Fault, error) {
	all := simreplica.Fault{Mode: simreplica.None}
	per := map[string]simreplica.Fault{}
	for _, spec := range specs {
		name, rest, hasName := strings.Cut(spec, "=")
		// "error:rate=0.5" has '=' only after the mode's ':'.
		if hasName && strings.ContainsAny(name, ":{") {
			hasName = false
		}
		if !hasName {
			rest = spec
		}
		f, err := simreplica.ParseFault(rest)
		if err != nil {
			return all, nil, fmt.Errorf("--fault %q: %w", spec, err)
		}
		if !hasName {
			all = f
			continue
		}
		if !validReplicaName(name, n) {
			return all, nil, fmt.Errorf("--fault %q: no replica named %q (have sim-1..sim-%d)", spec, name, n)
		}
		per[name] = f
	}
	return all, per, nil
}

func validReplicaName(name string, n int) bool {
	for i := 1; i <= n; i++ {
		if name == fmt.Sprintf("sim-%d", i) {
			return true
		}
	}
	return false
}
