// Command llmlb is an LLM-aware load balancer for fleets of vLLM (or other
// OpenAI-compatible) replicas. Subcommands: serve, epp, sim, demo, bench, validate.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/llmlb/llmlb/internal/version"
)

// command is one subcommand; run gets the arguments after the subcommand name.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string) error
}

var commands = []command{
	{"serve", "run the balancer in front of vLLM replicas", runServe},
	{"epp", "run the routing core as a gateway's endpoint picker (Envoy ext_proc gRPC)", runEPP},
	{"sim", "run simulated vLLM replicas", runSim},
	{"demo", "simulated fleet + balancer + agent-like traffic, with a live summary", runDemo},
	{"bench", "compare routing policies on a simulated fleet in virtual time", runBench},
	{"validate", "check a configuration file and explain every error", runValidate},
	{"loadgen", "hold concurrent streaming requests against a balancer (load and soak runs)", runLoadgen},
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: llmlb <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'llmlb <command> -h' for a command's flags, 'llmlb --version' for the version.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	if a := os.Args[1]; a == "--version" || a == "-version" || a == "version" {
		fmt.Println(version.Get())
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	for _, c := range commands {
		if c.name != os.Args[1] {
			continue
		}
		err := c.run(ctx, os.Args[2:])
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		if err != nil {
			// Package errors carry their package's prefix ("bench: ..."); do
			// not repeat the command's name in front of it.
			msg := strings.TrimPrefix(err.Error(), c.name+": ")
			fmt.Fprintf(os.Stderr, "llmlb %s: %s\n", c.name, msg)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintf(os.Stderr, "llmlb: unknown command %q\n\n", os.Args[1])
	usage()
	os.Exit(2)
}
