package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"reflect"
	"syscall"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/server"
)

// runServe is `llmlb serve`: the balancer in front of vLLM replicas. It runs
// until the signal (SIGTERM/SIGINT cancels ctx), then drains in-flight
// responses up to server.shutdown_timeout and exits 0.
func runServe(ctx context.Context, args []string) error {
	return runBalancer(ctx, args, serveFlags, nil)
}

// flagParser reads a command's flags into a validated configuration, the
// file's path and --watch-config (serve's and epp's differ in their
// listener flag only).
type flagParser func(args []string, stderr io.Writer) (config.Config, string, time.Duration, error)

// runBalancer runs serve's server (config, routing core, scraping, health,
// discovery, admin listener, reloads, drain); frontend, when not nil,
// builds what serves the proxy listener instead of the HTTP proxy (epp).
func runBalancer(ctx context.Context, args []string, parse flagParser, frontend func(*server.Server) (server.Frontend, error)) error {
	cfg, path, watch, err := parse(args, os.Stderr)
	if err != nil {
		return err
	}
	logger := newLogger(cfg.Log, os.Stderr)
	logConfig(logger, cfg)
	if len(cfg.Replicas) == 0 && !cfg.Discovery.Enabled() {
		logger.Warn("no replicas configured: every request gets 503 until one is added with POST /admin/replicas")
	}
	logWarnings(cfg, logger)
	srv, err := server.New(cfg, logger)
	if err != nil {
		return err
	}
	if frontend != nil {
		f, err := frontend(srv)
		if err != nil {
			return err
		}
		srv.UseFrontend(f)
	}
	if err := srv.Listen(); err != nil {
		return err
	}
	// SIGHUP re-reads the file (and flags) and applies the replica list.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reloadCtx, stopReload := context.WithCancel(ctx)
	defer stopReload()
	go reloadOnHUP(reloadCtx, hup, args, parse, srv, logger)
	if path != "" && watch > 0 {
		go watchFile(reloadCtx, path, watch, func() {
			logger.Info("reload: configuration file changed", slog.String("file", path))
			// Never block: a reload already queued reads the file anew, and
			// once reloadOnHUP has returned nobody reads hup any more.
			select {
			case hup <- syscall.SIGHUP:
			default:
			}
		})
	}
	return srv.Run(ctx)
}

// reloadOnHUP applies the re-read configuration on each SIGHUP until ctx
// ends: see reload.
func reloadOnHUP(ctx context.Context, hup <-chan os.Signal, args []string, parse flagParser, srv *server.Server, logger *slog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
		}
		reloadWith(parse, args, srv, logger)
	}
}

// watchFile calls changed each time path's content differs from what it
// was at the previous look, every interval until ctx ends. It compares
// content, not modification times: Kubernetes swaps a ConfigMap's files by
// symlink, and editors may keep the time. An unreadable file is not a
// change (a reload would only be rejected); it is looked at again.
func watchFile(ctx context.Context, path string, every time.Duration, changed func()) {
	sum := func() ([32]byte, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return [32]byte{}, false
		}
		return sha256.Sum256(b), true
	}
	last, _ := sum()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if cur, ok := sum(); ok && cur != last {
			last = cur
			changed()
		}
	}
}

// logLevel is serve's log level; a reload sets it (log.level).
var logLevel slog.LevelVar

// parseLevel reads log.level (Validate has rejected bad levels already).
func parseLevel(s string) slog.Level {
	var level slog.Level
	if err := level.UnmarshalText([]byte(s)); err != nil {
		return slog.LevelInfo
	}
	return level
}

// reload re-reads the file (and flags) and applies the replica list, the
// routing section (all but its policy and seed), log.level and the admin
// access (admin_token, admin.allowed_hosts,
// admin.allow_unauthenticated_mutations; docs/SECURITY.md: a token added
// by SIGHUP used to be ignored). An invalid file is logged at ERROR and
// changes nothing; a changed flow_control is refused with an ERROR (it needs
// a restart). Each reload is counted once in llmlb_config_reloads_total.
func reload(args []string, srv *server.Server, logger *slog.Logger) {
	reloadWith(serveFlags, args, srv, logger)
}

// reloadWith is reload with the command's own flag parser (serve's or epp's).
func reloadWith(parse flagParser, args []string, srv *server.Server, logger *slog.Logger) {
	cfg, _, _, err := parse(args, io.Discard)
	if err != nil {
		srv.Metrics().Reload("rejected")
		logger.Error("reload: configuration rejected, keeping the current replicas and admin access", slog.String("error", err.Error()))
		return
	}
	srv.SetAdminAccess(cfg)
	srv.ReloadCertificates()
	logger.Info("reload: admin access applied", slog.Bool("admin_token_set", cfg.AdminToken != ""),
		slog.Any("allowed_hosts", cfg.Admin.AllowedHosts),
		slog.Bool("allow_unauthenticated_mutations", cfg.Admin.AllowUnauthenticatedMutations))
	logWarnings(cfg, logger)
	added, removed, err := srv.Reload(cfg.Replicas)
	attrs := []any{slog.Any("added", added), slog.Any("removed", removed)}
	if err != nil {
		srv.Metrics().Reload("partial")
		logger.Error("reload: replicas partly applied", append(attrs, slog.String("error", err.Error()))...)
		return
	}
	logger.Info("reload: replicas applied", attrs...)
	result := "applied"
	if err := srv.ReloadRouting(cfg); err != nil {
		result = "partial"
		logger.Error("reload: routing settings not applied", slog.String("error", err.Error()))
	} else {
		logger.Info("reload: routing settings applied")
	}
	if err := srv.ReloadFlowControl(cfg); err != nil {
		result = "partial"
		logger.Error("reload: flow_control not applied", slog.String("error", err.Error()))
	}
	logLevel.Set(parseLevel(cfg.Log.Level))
	srv.Metrics().Reload(result)
	if changed := needRestart(srv.Config(), cfg); len(changed) > 0 {
		logger.Warn("reload: changed settings not applied; they need a restart", slog.Any("sections", changed))
	}
}

// needRestart lists the sections whose new value differs from the running
// one among those a reload does not apply (all but the replica list, the
// admin access, routing (its policy and seed aside, refused with their own
// error) and log.level).
func needRestart(running, next config.Config) []string {
	a, b := running.Redacted(), next.Redacted()
	var out []string
	for _, s := range []struct {
		name string
		a, b any
	}{
		{"listen", a.Listen, b.Listen}, {"admin_listen", a.AdminListen, b.AdminListen},
		{"discovery", a.Discovery, b.Discovery}, {"tokenizers", a.Tokenizers, b.Tokenizers},
		{"request", a.Request, b.Request}, {"scrape", a.Scrape, b.Scrape}, {"proxy", a.Proxy, b.Proxy},
		{"server", a.Server, b.Server}, {"log.format", a.Log.Format, b.Log.Format},
	} {
		if !reflect.DeepEqual(s.a, s.b) {
			out = append(out, s.name)
		}
	}
	return out
}

// logWarnings logs what is valid but risky in cfg at WARN (an admin
// listener on the network without a token, first of all), then what is
// valid but probably not meant (config.Notices).
func logWarnings(cfg config.Config, logger *slog.Logger) {
	for _, w := range cfg.Warnings() {
		logger.Warn("SECURITY: " + w)
	}
	for _, n := range cfg.Notices() {
		logger.Warn(n)
	}
}

// serveConfig reads serve's flags: the file (or the defaults), overridden by
// --listen, --admin-listen, --replica and --log-level, then validated.
func serveConfig(args []string, stderr io.Writer) (config.Config, error) {
	cfg, _, _, err := serveFlags(args, stderr)
	return cfg, err
}

// serveFlags is serveConfig that also returns the file's path and how
// often to look for changes to it (--watch-config).
func serveFlags(args []string, stderr io.Writer) (config.Config, string, time.Duration, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", "", "proxy listen `ADDR` (overrides listen; default :8080)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmlb serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--replica URL|name=URL ...] [--policy P] [--log-level L]")
		fmt.Fprintln(stderr, "\nRuns the balancer; flags override the file, and LLMLB_<FLAG> environment variables")
		fmt.Fprintln(stderr, "(LLMLB_CONFIG, LLMLB_LISTEN, LLMLB_ADMIN_LISTEN, LLMLB_POLICY, LLMLB_LOG_LEVEL; LLMLB_REPLICA")
		fmt.Fprintln(stderr, "comma-separated) stand in for flags not given. SIGTERM/SIGINT drain and exit.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	return balancerFlags(fs, listen, args, stderr)
}

// balancerFlags adds the flags serve and epp share to fs (which holds the
// command's listener flag, listen, and its usage), parses args and returns
// the validated configuration.
func balancerFlags(fs *flag.FlagSet, listen *string, args []string, stderr io.Writer) (config.Config, string, time.Duration, error) {
	fs.SetOutput(stderr)
	path := fs.String("config", "", "YAML configuration `FILE` (default: built-in defaults)")
	adminListen := fs.String("admin-listen", "", "admin listen `ADDR` (overrides admin_listen; default 127.0.0.1:9090)")
	logLevel := fs.String("log-level", "", "log `LEVEL`: debug|info|warn|error (overrides log.level)")
	watch := fs.Duration("watch-config", 5*time.Second, "re-read the --config file this often and reload it when its content changes (0: only on SIGHUP)")
	policy := fs.String("policy", "", "routing `POLICY` (overrides routing.policy): cost, llmlb, llmlb-warm, rr, least-request, sticky, prefix-tree,\nllm-d, or another router's name: cache_aware, round_robin, consistent_hash, least_request")
	var replicas []string
	fs.Func("replica", "replica `name=URL` or URL, repeatable (replaces the file's list)", func(s string) error {
		replicas = append(replicas, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return config.Config{}, "", 0, err
	}
	if fs.NArg() > 0 {
		return config.Config{}, "", 0, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := flagsFromEnv(fs, os.LookupEnv); err != nil {
		return config.Config{}, "", 0, err
	}
	cfg := config.Default()
	if *path != "" {
		var err error
		if cfg, err = config.Load(*path); err != nil {
			return config.Config{}, "", 0, err
		}
	}
	if err := config.ApplyFlags(&cfg, *listen, *adminListen, replicas); err != nil {
		return config.Config{}, "", 0, err
	}
	if *logLevel != "" {
		cfg.Log.Level = *logLevel
	}
	if *policy != "" {
		p, err := resolvePolicy(*policy)
		if err != nil {
			return config.Config{}, "", 0, err
		}
		cfg.Routing.Policy = p
	}
	if err := cfg.Validate(); err != nil {
		return config.Config{}, "", 0, errors.Join(errors.New("invalid configuration (see llmlb validate)"), err)
	}
	if *watch < 0 {
		return config.Config{}, "", 0, fmt.Errorf("--watch-config %v: must not be negative", *watch)
	}
	return cfg, *path, *watch, nil
}

// newLogger builds the slog logger of log.level and log.format.
func newLogger(c config.Log, w io.Writer) *slog.Logger {
	logLevel.Set(parseLevel(c.Level))
	opts := &slog.HandlerOptions{Level: &logLevel}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
