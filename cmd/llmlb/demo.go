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
	"path/filepath"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/replicaurl"
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
	logFile     string
	policy      string
	plain       bool
	serveHealth bool
}

// The demo's health timings: faster than serve's defaults so that the flap
// episode, from ejection back to LIVE, fits in the first minute.
const (
	demoScrapeInterval = time.Second      // serve: 3 s
	demoBaseCooldown   = 10 * time.Second // serve: 30 s
	demoProbingWindow  = 10 * time.Second // serve: 15 s
)

const demoUsage = `usage: llmlb demo [flags]

A zero-configuration first run: a simulated fleet of vLLM replicas in this
process, the balancer in front of it (with its live dashboard at /ui), and
agent-like traffic (users with sessions, shared system prompts, bursts of
streaming requests). On a terminal it redraws one screen in place: the
replica table, decisions per second, and the current episode; part-way
through one replica flaps and you watch it go EJECTED -> PROBING -> LIVE.
--plain (the default when stdout is not a terminal) prints one line per tick.
The balancer's logs go to a file whose name is printed. Ctrl-C stops it.

The demo scrapes every %s and cools an ejected replica down for %s with a
%s probing window (serve's defaults: 3s, 30s, 15s; --serve-health uses them).

examples:
  llmlb demo
  llmlb demo --policy llmlb-warm --users 20
  llmlb demo --plain --duration 2m > demo.txt

flags:
`

// demoFlags defines the flags of `llmlb demo` on o, with its help on out.
func demoFlags(o *demoOptions, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(out, demoUsage, demoScrapeInterval, demoBaseCooldown, demoProbingWindow)
		fs.PrintDefaults()
	}
	fs.IntVar(&o.replicas, "replicas", 4, "simulated replicas")
	fs.StringVar(&o.profile, "profile", "2x3090-tp2", "simulated GPU profile (see docs/SIMULATOR.md)")
	fs.StringVar(&o.model, "model", "sim-model", "model name the fleet serves")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "balancer address (a free port is taken if this one is busy)")
	fs.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:9090", "admin and dashboard address (a free port is taken if this one is busy)")
	fs.IntVar(&o.users, "users", 12, "simulated agent users")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until Ctrl-C)")
	fs.DurationVar(&o.every, "every", time.Second, "interval between redraws (or lines with --plain)")
	fs.DurationVar(&o.flapAfter, "flap-after", 10*time.Second, "when the last replica starts to flap (0: never)")
	fs.DurationVar(&o.flapFor, "flap-for", 10*time.Second, "how long it flaps before it recovers")
	fs.DurationVar(&o.flapPeriod, "flap-period", 8*time.Second, "one down+up cycle of the flap")
	fs.StringVar(&o.logLevel, "log-level", "info", "balancer log level: debug|info|warn|error")
	fs.StringVar(&o.logFile, "log-file", "", "file for the balancer's logs (default: a new file in the temporary directory)")
	fs.StringVar(&o.policy, "policy", policy.DefaultName, "routing policy: "+strings.Join(policy.Names(), ", "))
	fs.BoolVar(&o.plain, "plain", !isTerminal(os.Stdout), "one line per tick instead of a redrawn screen (default when stdout is not a terminal)")
	fs.BoolVar(&o.serveHealth, "serve-health", false, "use serve's default health timings (the flap episode then takes about 1.5 minutes)")
	return fs
}

func runDemo(ctx context.Context, args []string) error {
	var o demoOptions
	fs := demoFlags(&o, os.Stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	return demo(ctx, o, os.Stdout)
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// demo runs the fleet, the balancer, the traffic and the screen (or the
// plain lines) until ctx ends.
func demo(ctx context.Context, o demoOptions, out io.Writer) error {
	level, err := o.validate()
	if err != nil {
		return err
	}
	cfg, err := o.config()
	if err != nil {
		return err
	}
	logFile, err := openDemoLog(o.logFile)
	if err != nil {
		return err
	}
	defer logFile.Close()
	r := &demoRun{o: o, out: out, logPath: logFile.Name(),
		logger: slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: level}))}

	// The fleet and the balancer do not stop with ctx: at the end the
	// traffic stops first, so that in-flight requests finish.
	fleetCtx, stopFleet := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFleet()
	if err := r.startFleet(fleetCtx); err != nil {
		return err
	}
	serverCtx, stopServer := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServer()
	if err := r.startServer(serverCtx, cfg); err != nil {
		return err
	}
	r.newScreen()

	// Traffic starts once every replica passed its first scrape: a replica
	// never seen healthy takes no traffic (start-up order), and the demo's
	// clients should not open with a burst of 503s.
	waitLive(ctx, r.srv.Balancer(), len(r.fleet.Replicas), 10*time.Second)
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	r.startTraffic(trafficCtx, stopTraffic)

	if !o.plain {
		// Shown again only after the closing lines, whatever ends the demo.
		defer fmt.Fprint(out, ansiShowCursor)
	}
	if err := r.watch(ctx); err != nil {
		return err
	}
	return r.shutdown(stopServer, stopFleet)
}

// validate checks the flags demo cannot run with and returns the log level.
func (o demoOptions) validate() (slog.Level, error) {
	var level slog.Level
	if o.replicas < 1 {
		return level, errors.New("--replicas must be at least 1")
	}
	if o.every <= 0 {
		return level, errors.New("--every must be positive")
	}
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return level, fmt.Errorf("--log-level: %w", err)
	}
	return level, nil
}

// config is the balancer's configuration for the demo: serve's defaults,
// the policy of --policy and the demo's faster health timings.
func (o demoOptions) config() (config.Config, error) {
	cfg := config.Default()
	// The demo has no token: on a loopback admin address (the default) its
	// mutations are open so that curl can add, drain and remove replicas;
	// elsewhere they stay disabled (config.Admin).
	cfg.AdminListen = o.adminListen
	cfg.Admin.AllowUnauthenticatedMutations = replicaurl.IsLoopback(o.adminListen)
	if o.policy != "" {
		cfg.Routing.Policy = o.policy
		if err := cfg.Routing.Validate(); err != nil {
			return cfg, fmt.Errorf("--policy: %w", err)
		}
	}
	if !o.serveHealth {
		cfg.Scrape.Interval = demoScrapeInterval
		cfg.Routing.Health.BaseCooldown = demoBaseCooldown
		cfg.Routing.Health.ProbingWindow = demoProbingWindow
	}
	return cfg, nil
}

// demoRun is one run of the demo: what its steps start and share.
type demoRun struct {
	o       demoOptions
	out     io.Writer
	logger  *slog.Logger
	logPath string

	fleet      *simreplica.Fleet
	srv        *server.Server
	proxyLn    net.Listener
	adminLn    net.Listener
	serverDone chan error // srv.Run's result

	sc        *demoScreen
	victim    *simreplica.Replica // the replica that flaps
	flaps     bool                // whether a replica flaps at all
	flapping  bool                // the victim was set to flap
	recovered bool                // the victim was set back to healthy

	gen         *traffic.Generator
	stopTraffic context.CancelFunc
	trafficDone chan struct{} // closed when gen.Run returns
}

// startFleet starts the simulated replicas; they run until ctx ends.
func (r *demoRun) startFleet(ctx context.Context) error {
	fleet, err := simreplica.StartFleet(ctx, simreplica.FleetOptions{
		Replicas: r.o.replicas, Profile: r.o.profile, Model: r.o.model, Seed: 1, Logger: r.logger,
	})
	if err != nil {
		return err
	}
	r.fleet = fleet
	return nil
}

// startServer starts the balancer in front of the fleet, on the flags'
// addresses or free ports; it runs until ctx ends and reports on
// r.serverDone.
func (r *demoRun) startServer(ctx context.Context, cfg config.Config) error {
	for _, rep := range r.fleet.Replicas {
		cfg.Replicas = append(cfg.Replicas, config.Replica{Name: rep.Name(), URL: rep.URL(), Models: []string{r.o.model}})
	}
	srv, err := server.New(cfg, r.logger)
	if err != nil {
		return err
	}
	proxyLn, err := listenOrFree(r.o.listen)
	if err != nil {
		return err
	}
	adminLn, err := listenOrFree(r.o.adminListen)
	if err != nil {
		proxyLn.Close()
		return err
	}
	srv.UseListeners(proxyLn, adminLn)
	r.srv, r.proxyLn, r.adminLn = srv, proxyLn, adminLn

	r.serverDone = make(chan error, 1)
	go func() { r.serverDone <- srv.Run(ctx) }()
	return nil
}

// newScreen sets up the screen (or the plain lines, whose header it
// writes) and the flap episode, when a replica flaps.
func (r *demoRun) newScreen() {
	o := r.o
	r.sc = &demoScreen{
		ui: "http://" + r.adminLn.Addr().String() + "/ui", proxy: "http://" + r.proxyLn.Addr().String(),
		admin: "http://" + r.adminLn.Addr().String(), logPath: r.logPath,
		policy: r.srv.Balancer().Policy(), profile: o.profile, model: o.model, users: o.users,
		replicas: o.replicas, ansi: !o.plain,
	}
	r.victim = r.fleet.Replicas[len(r.fleet.Replicas)-1]
	r.flaps = o.flapAfter > 0 && len(r.fleet.Replicas) > 1
	if r.flaps {
		r.sc.episode = &episode{victim: r.victim.Name(), after: o.flapAfter, period: o.flapPeriod, length: o.flapFor}
	}
	if o.plain {
		r.sc.writeHeader(r.out)
	}
}

// startTraffic starts the agent-like clients against the balancer; they
// run until ctx ends (stop ends it) and close r.trafficDone.
func (r *demoRun) startTraffic(ctx context.Context, stop context.CancelFunc) {
	r.gen = traffic.New(traffic.Options{
		BaseURL: r.sc.proxy, Model: r.o.model, Users: r.o.users, Projects: 3,
		BurstMin: 1, BurstMax: 5, Turns: 8, Think: 2 * time.Second, MaxTokens: 64,
		SystemPromptChars: 12000, Seed: 1,
	})
	r.stopTraffic = stop
	r.trafficDone = make(chan struct{})
	go func() { r.gen.Run(ctx); close(r.trafficDone) }()
}

// watch redraws every --every, and flaps the victim on schedule, until ctx
// ends; it returns early with an error when the balancer stops.
func (r *demoRun) watch(ctx context.Context) error {
	start := time.Now()
	r.sc.start = start
	tick := time.NewTicker(r.o.every)
	defer tick.Stop()
	if !r.o.plain {
		fmt.Fprint(r.out, ansiClear+ansiHideCursor)
		r.draw(start)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-r.serverDone:
			r.stopTraffic()
			<-r.trafficDone
			return fmt.Errorf("balancer stopped: %w", err)
		case <-tick.C:
		}
		elapsed := time.Since(start)
		if r.flaps {
			if err := r.flap(elapsed); err != nil {
				return err
			}
		}
		r.draw(start)
	}
}

// flap makes the victim flap once --flap-after has passed and recover
// --flap-for later, each once.
func (r *demoRun) flap(elapsed time.Duration) error {
	o := r.o
	if !r.flapping && elapsed >= o.flapAfter {
		r.flapping = true
		r.sc.episode.flapping(elapsed)
		r.logger.Info("demo: replica starts to flap", slog.String("replica", r.victim.Name()), slog.Duration("period", o.flapPeriod))
		if err := r.victim.SetFault(simreplica.Fault{Mode: simreplica.Flap, Period: o.flapPeriod}); err != nil {
			return err
		}
	}
	if r.flapping && !r.recovered && elapsed >= o.flapAfter+o.flapFor {
		r.recovered = true
		r.sc.episode.recovered(elapsed)
		r.logger.Info("demo: replica recovers", slog.String("replica", r.victim.Name()))
		if err := r.victim.SetFault(simreplica.Fault{Mode: simreplica.None}); err != nil {
			return err
		}
	}
	return nil
}

// draw writes one frame: the screen, or one plain line.
func (r *demoRun) draw(start time.Time) {
	now := time.Now()
	f := frame{elapsed: now.Sub(start), snap: r.srv.Dashboard().Snapshot(now), traffic: r.gen.Stats().Snapshot()}
	if r.sc.episode != nil {
		r.sc.episode.observe(start, f.snap.Transitions)
	}
	if r.o.plain {
		r.sc.writeLine(r.out, f)
	} else {
		r.sc.writeScreen(r.out, f)
	}
}

// shutdown stops the traffic, then the balancer, then the fleet, each
// after the one in front of it has finished, and prints the totals. The
// balancer's error wins over the fleet's.
func (r *demoRun) shutdown(stopServer, stopFleet context.CancelFunc) error {
	fmt.Fprintln(r.out, "\nstopping: letting in-flight requests finish...")
	r.stopTraffic()
	<-r.trafficDone
	stopServer()
	err := <-r.serverDone
	stopFleet()
	if ferr := r.fleet.Wait(); err == nil {
		err = ferr
	}
	s := r.gen.Stats().Snapshot()
	fmt.Fprintf(r.out, "done: %d requests, %d ok, %d failed%s; logs in %s\n", s.Requests, s.OK, s.Failed, failureNote(s), r.logPath)
	return err
}

// openDemoLog opens the demo's log file: path, or a new file in the
// temporary directory.
func openDemoLog(path string) (*os.File, error) {
	if path == "" {
		f, err := os.CreateTemp("", "llmlb-demo-*.log")
		if err != nil {
			return nil, fmt.Errorf("log file: %w", err)
		}
		return f, nil
	}
	f, err := os.OpenFile(filepath.Clean(path), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("--log-file: %w", err)
	}
	return f, nil
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

// waitLive returns when n replicas are LIVE, ctx ends or limit passes.
func waitLive(ctx context.Context, bal *balancer.Balancer, n int, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		live := 0
		for _, r := range bal.Replicas(time.Now()) {
			if r.State == "LIVE" {
				live++
			}
		}
		if live >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
