package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/server"
	"github.com/llmlb/llmlb/internal/simreplica"
	"github.com/llmlb/llmlb/internal/traffic"
)

// demoOptions are the flags of `llmlb demo`.
type demoOptions struct {
	replicas    int
	profile     string
	model       string
	listen      string
	adminListen string
	users       int
	duration    time.Duration
	every       time.Duration
	flapAfter   time.Duration
	flapFor     time.Duration
	flapPeriod  time.Duration
	logLevel    string
	policy      string
}

func runDemo(ctx context.Context, args []string) error {
	var o demoOptions
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.IntVar(&o.replicas, "replicas", 4, "simulated replicas")
	fs.StringVar(&o.profile, "profile", "2x3090-tp2", "simulated GPU profile (see docs/SIMULATOR.md)")
	fs.StringVar(&o.model, "model", "sim-model", "model name the fleet serves")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "balancer address (a free port is taken if this one is busy)")
	fs.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:9090", "admin address (a free port is taken if this one is busy)")
	fs.IntVar(&o.users, "users", 12, "simulated agent users")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	fs.DurationVar(&o.every, "every", 3*time.Second, "interval of the live summary")
	fs.DurationVar(&o.flapAfter, "flap-after", 30*time.Second, "when the last replica starts to flap (0: never)")
	fs.DurationVar(&o.flapFor, "flap-for", 45*time.Second, "how long it flaps before it recovers")
	fs.DurationVar(&o.flapPeriod, "flap-period", 15*time.Second, "one down+up cycle of the flap")
	fs.StringVar(&o.logLevel, "log-level", "info", "balancer log level on stderr: debug|info|warn|error")
	fs.StringVar(&o.policy, "policy", "llmlb", "routing policy: llmlb, llmlb-warm, rr, least-request, sticky, prefix-tree")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if o.replicas < 1 {
		return errors.New("--replicas must be at least 1")
	}
	if o.every <= 0 {
		return errors.New("--every must be positive")
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	return demo(ctx, o, os.Stdout, os.Stderr)
}

// demo runs the fleet, the balancer, the traffic and the summary until ctx ends.
func demo(ctx context.Context, o demoOptions, out, logOut io.Writer) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))

	cfg := config.Default()
	// The demo has no token: on a loopback admin address (the default) its
	// mutations are open so that curl can add, drain and remove replicas;
	// elsewhere they stay disabled (config.Admin).
	cfg.AdminListen = o.adminListen
	cfg.Admin.AllowUnauthenticatedMutations = config.IsLoopback(o.adminListen)
	if o.policy != "" {
		cfg.Routing.Policy = o.policy
		if err := cfg.Routing.Validate(); err != nil {
			return fmt.Errorf("--policy: %w", err)
		}
	}

	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	fleet, err := simreplica.StartFleet(fleetCtx, simreplica.FleetOptions{
		Replicas: o.replicas, Profile: o.profile, Model: o.model, Seed: 1,
	})
	if err != nil {
		return err
	}

	for _, r := range fleet.Replicas {
		cfg.Replicas = append(cfg.Replicas, config.Replica{Name: r.Name(), URL: r.URL(), Models: []string{o.model}})
	}
	srv, err := server.New(cfg, logger)
	if err != nil {
		return err
	}
	proxyLn, err := listenOrFree(o.listen)
	if err != nil {
		return err
	}
	adminLn, err := listenOrFree(o.adminListen)
	if err != nil {
		proxyLn.Close()
		return err
	}
	srv.UseListeners(proxyLn, adminLn)

	serverCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServer()
	serverDone := make(chan error, 1)
	go func() { serverDone <- srv.Run(serverCtx) }()

	proxyURL := "http://" + proxyLn.Addr().String()
	adminURL := "http://" + adminLn.Addr().String()
	fmt.Fprintf(out, `llmlb demo: %d simulated %s replicas (model %q) behind the balancer (policy %s).
  proxy:  %s   (OpenAI-compatible; try the curl below)
  admin:  %s/admin/replicas   %s/admin/pins   %s/metrics
  curl %s/v1/chat/completions -H 'Content-Type: application/json' -H 'X-Session-Id: me' \
       -d '{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":16}'
%d agent users send bursts of streaming requests with shared system prompts.
`, o.replicas, o.profile, o.model, srv.Balancer().Policy(), proxyURL, adminURL, adminURL, adminURL, proxyURL, o.model, o.users)
	victim := fleet.Replicas[len(fleet.Replicas)-1]
	if o.flapAfter > 0 && len(fleet.Replicas) > 1 {
		fmt.Fprintf(out, "At %s replica %s starts to flap (down/up every %s) for %s: watch it get EJECTED, then PROBING, then LIVE.\n",
			o.flapAfter, victim.Name(), o.flapPeriod, o.flapFor)
	}
	fmt.Fprintln(out, "Ctrl-C stops the demo.")

	gen := traffic.New(traffic.Options{
		BaseURL: proxyURL, Model: o.model, Users: o.users, Projects: 3,
		BurstMin: 1, BurstMax: 5, Turns: 8, Think: 2 * time.Second, MaxTokens: 64,
		SystemPromptChars: 12000, Seed: 1,
	})
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	trafficDone := make(chan struct{})
	go func() { gen.Run(trafficCtx); close(trafficDone) }()

	start := time.Now()
	tick := time.NewTicker(o.every)
	defer tick.Stop()
	flapping, recovered := false, false
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err := <-serverDone:
			stopTraffic()
			<-trafficDone
			return fmt.Errorf("balancer stopped: %w", err)
		case <-tick.C:
		}
		elapsed := time.Since(start)
		if o.flapAfter > 0 && len(fleet.Replicas) > 1 {
			if !flapping && elapsed >= o.flapAfter {
				flapping = true
				fmt.Fprintf(out, "\n>>> %s: replica %s starts to flap; streams in flight on it are cut and end with an SSE error event\n"+
					"    (llmlb retries only before the first byte), requests not yet started fail over to other replicas\n",
					elapsed.Round(time.Second), victim.Name())
				if err := victim.SetFault(simreplica.Fault{Mode: simreplica.Flap, Period: o.flapPeriod}); err != nil {
					return err
				}
			}
			if flapping && !recovered && elapsed >= o.flapAfter+o.flapFor {
				recovered = true
				fmt.Fprintf(out, "\n>>> %s: replica %s recovers; it returns only through scrapes, PROBING and a clean window\n", elapsed.Round(time.Second), victim.Name())
				if err := victim.SetFault(simreplica.Fault{Mode: simreplica.None}); err != nil {
					return err
				}
			}
		}
		printSummary(out, elapsed, srv, fleet, gen.Stats().Snapshot())
	}

	fmt.Fprintln(out, "\nstopping: letting in-flight requests finish...")
	stopTraffic()
	<-trafficDone
	stopServer()
	err = <-serverDone
	stopFleet()
	if ferr := fleet.Wait(); err == nil {
		err = ferr
	}
	s := gen.Stats().Snapshot()
	fmt.Fprintf(out, "done: %d requests, %d ok, %d failed\n", s.Requests, s.OK, s.Failed)
	return err
}

// printSummary writes one block of the live summary.
func printSummary(out io.Writer, elapsed time.Duration, srv *server.Server, fleet *simreplica.Fleet, s traffic.Summary) {
	now := time.Now()
	reps := srv.Balancer().Replicas(now)
	var total uint64
	for _, r := range reps {
		total += r.Requests
	}
	fmt.Fprintf(out, "\n[%s] requests %d (ok %d, failed %d)  ttfb p50 %s p99 %s  alerts %d\n",
		elapsed.Round(time.Second), s.Requests, s.OK, s.Failed,
		s.TTFBp50.Round(time.Millisecond), s.TTFBp99.Round(time.Millisecond), len(srv.Balancer().Alerts(now)))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "replica\tstate\teff.running\teff.waiting\tin-flight\tshare\tcache hit\tejections")
	for _, r := range reps {
		share := 0.0
		if total > 0 {
			share = float64(r.Requests) / float64(total)
		}
		hit := "-"
		if rep := fleet.Replica(r.Name); rep != nil {
			st := rep.Stats()
			if st.PrefixQueryTokens > 0 {
				hit = fmt.Sprintf("%.0f%%", 100*float64(st.PrefixHitTokens)/float64(st.PrefixQueryTokens))
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%.1f\t%d\t%.0f%%\t%s\t%d\n", r.Name, r.State,
			r.EffectiveRunning, r.EffectiveWaiting, r.InFlight, 100*share, hit, r.Ejections)
	}
	tw.Flush()
}

// listenOrFree listens on addr, or on a free port of the same host if addr is
// busy, so the demo runs on a machine where 8080 is taken.
func listenOrFree(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	host, _, splitErr := net.SplitHostPort(addr)
	if splitErr != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return net.Listen("tcp", net.JoinHostPort(host, "0"))
}
