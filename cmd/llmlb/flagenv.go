package main

import (
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/llmlb/llmlb/internal/config"
)

// envName is the environment variable standing in for a flag:
// --admin-listen -> LLMLB_ADMIN_LISTEN.
func envName(flagName string) string {
	return "LLMLB_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flagsFromEnv sets every flag not given on the command line from its
// LLMLB_* environment variable, when set (containers and systemd units
// configure through the environment). A repeatable flag takes a
// comma-separated list. Flags on the command line win.
func flagsFromEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		v, ok := lookup(envName(f.Name))
		if !ok || v == "" {
			return
		}
		vals := []string{v}
		if f.Name == "replica" {
			vals = strings.Split(v, ",")
		}
		for _, x := range vals {
			if e := fs.Set(f.Name, strings.TrimSpace(x)); e != nil {
				err = fmt.Errorf("%s: %w", envName(f.Name), e)
				return
			}
		}
	})
	return err
}

// logConfig logs the effective configuration readably: one summary line
// at info, and each section on its own line at debug (secrets redacted).
func logConfig(logger *slog.Logger, cfg config.Config) {
	logger.Info("configuration",
		slog.String("listen", cfg.Listen), slog.String("admin_listen", cfg.AdminListen),
		slog.Int("replicas", len(cfg.Replicas)), slog.String("discovery", cfg.Discovery.Type),
		slog.String("policy", cfg.Routing.Policy), slog.Bool("admin_token_set", cfg.AdminToken != ""),
		slog.String("log_level", cfg.Log.Level))
	r := cfg.Redacted()
	for _, sec := range []struct {
		name string
		v    any
	}{
		{"replicas", r.Replicas}, {"discovery", r.Discovery}, {"admin", r.Admin}, {"routing", r.Routing},
		{"request", r.Request}, {"scrape", r.Scrape}, {"proxy", r.Proxy}, {"server", r.Server}, {"log", r.Log},
	} {
		logger.Debug("configuration section", slog.String("section", sec.name), slog.Any("value", sec.v))
	}
}
