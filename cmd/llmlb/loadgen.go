package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/traffic"
)

// runLoadgen holds a number of concurrent streaming chat completions against a
// balancer (or any OpenAI-compatible endpoint) and prints what the clients saw.
// It is the load half of docs/GUARANTEES.md's load and soak runs.
func runLoadgen(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintln(out, "usage: llmlb loadgen [--target URL] [--streams N] [--duration D] [flags]")
		fmt.Fprintln(out, "\nHolds concurrent streaming chat completions against a balancer and prints what the clients saw")
		fmt.Fprintln(out, "(the load half of docs/GUARANTEES.md's load and soak runs).")
		fmt.Fprintln(out, "\nflags:")
		fs.PrintDefaults()
	}
	target := fs.String("target", "http://127.0.0.1:8080", "balancer base URL")
	model := fs.String("model", "sim-model", "model name")
	streams := fs.Int("streams", 100, "concurrent clients; each sends one streaming request after another")
	burstMax := fs.Int("burst-max", 1, "parallel requests per client turn, at most (agents: 3-10)")
	maxTokens := fs.Int("max-tokens", 64, "max_tokens of every request")
	think := fs.Duration("think", 0, "mean think time between a client's turns")
	duration := fs.Duration("duration", time.Minute, "how long to run")
	every := fs.Duration("every", 5*time.Second, "progress interval on stderr")
	promptChars := fs.Int("system-prompt-chars", 2000, "characters of each project's system prompt")
	jsonOut := fs.Bool("json", false, "print the final summary as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if *streams < 1 || *duration <= 0 || *every <= 0 {
		return errors.New("--streams, --duration and --every must be positive")
	}
	gen := traffic.New(traffic.Options{
		BaseURL: *target, Model: *model, Users: *streams, Projects: 4,
		BurstMin: 1, BurstMax: *burstMax, Turns: 10, Think: *think, MaxTokens: *maxTokens,
		SystemPromptChars: *promptChars, Seed: 1,
		Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *streams * max(1, *burstMax)}},
	})
	runCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	done := make(chan struct{})
	go func() { gen.Run(runCtx); close(done) }()
	start := time.Now()
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			s := gen.Stats().Snapshot()
			fmt.Fprintf(os.Stderr, "[%s] requests %d ok %d failed %d ttfb p50 %s p99 %s\n",
				time.Since(start).Round(time.Second), s.Requests, s.OK, s.Failed, s.TTFBp50, s.TTFBp99)
		}
	}
	s := gen.Stats().Snapshot()
	if *jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(s)
	}
	fmt.Printf("requests %d ok %d failed %d ttfb p50 %s p99 %s\nby status %v\nby replica %v\nerrors %v\n",
		s.Requests, s.OK, s.Failed, s.TTFBp50, s.TTFBp99, s.ByStatus, s.ByReplica, s.Errors)
	if s.Failed > 0 {
		return fmt.Errorf("%d of %d requests failed", s.Failed, s.Requests)
	}
	return nil
}
