package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/modeltok"
)

// runValidate is `llmlb validate --config FILE`: it parses and validates the
// file (with serve's overriding flags, if given) and prints
// "ok: N replicas, policy P" or every problem, one per line (exit 1).
func runValidate(ctx context.Context, args []string) error {
	return validateMain(args, os.Stdout, os.Stderr)
}

// validateMain is runValidate with its output streams, for tests.
func validateMain(args []string, stdout, stderr io.Writer) error {
	return validateEnv(args, stdout, stderr, os.LookupEnv)
}

// validateEnv is validateMain with the environment's lookup: validate reads
// the same LLMLB_* variables as serve, so it checks what serve would run.
func validateEnv(args []string, stdout, stderr io.Writer, lookupEnv func(string) (string, bool)) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", "", "configuration `FILE` to check (without it, the defaults with serve's flags, as serve runs)")
	printCfg := fs.Bool("print", false, "print the effective configuration (defaults filled in, secrets redacted)")
	listen := fs.String("listen", "", "as for serve: override listen")
	adminListen := fs.String("admin-listen", "", "as for serve: override admin_listen")
	policyName := fs.String("policy", "", "as for serve: override routing.policy (other routers' names too, e.g. cache_aware)")
	logLevel := fs.String("log-level", "", "as for serve: override log.level")
	fs.Duration("watch-config", 5*time.Second, "as for serve (accepted so that serve's flags and LLMLB_WATCH_CONFIG check alike; unused)")
	var replicas []string
	fs.Func("replica", "as for serve: a replica `name=URL` or URL (repeatable; replaces the file's list)", func(s string) error {
		replicas = append(replicas, s)
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: llmlb validate [--config FILE] [--print] [serve's --listen, --admin-listen, --replica, --policy, --log-level]")
		fmt.Fprintln(stderr, "\nChecks a configuration and explains every error (docs/CONFIG.md). As serve, it reads")
		fmt.Fprintln(stderr, "LLMLB_<FLAG> environment variables (LLMLB_CONFIG, LLMLB_POLICY, ...) for flags not given.")
		fmt.Fprintln(stderr, "\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err // flag.ErrHelp for -h; the flag package printed the problem
	}
	if *path == "" && fs.NArg() == 1 {
		_ = fs.Set("config", fs.Arg(0)) // `llmlb validate FILE` works too (a string flag takes any value)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (give the file with --config)", fs.Args())
	}
	if err := flagsFromEnv(fs, lookupEnv); err != nil {
		return err
	}
	// Like serve, validate runs without a file when flags (or LLMLB_*
	// variables) say what to serve: it then checks the defaults with them.
	source := *path
	cfg, err := config.Default(), error(nil)
	switch {
	case *path != "":
		cfg, err = config.Load(*path)
	case fs.NFlag() == 0:
		fs.Usage()
		return errors.New("--config FILE is required (or serve's flags, such as --replica, to check without a file)")
	default:
		source = "flags"
	}
	if err == nil || cfg.Listen != "" { // decoded, perhaps with errors: check the rest too
		ferr := config.ApplyFlags(&cfg, *listen, *adminListen, replicas)
		if *logLevel != "" {
			cfg.Log.Level = *logLevel
		}
		if *policyName != "" {
			p, perr := resolvePolicy(*policyName)
			cfg.Routing.Policy = p
			ferr = errors.Join(ferr, perr)
		}
		if ferr != nil {
			err = errors.Join(err, ferr)
		} else {
			err = cfg.ValidateAfter(err)
		}
	}
	var toks *modeltok.Set
	if err == nil && len(cfg.Tokenizers) > 0 {
		// serve reads them at start; a file it cannot use is found here.
		var terr error
		if toks, terr = modeltok.LoadAll(cfg.Tokenizers); terr != nil {
			err = terr
		}
	}
	if err != nil {
		problems := strings.Split(err.Error(), "\n")
		for _, p := range problems {
			fmt.Fprintln(stderr, p)
		}
		return fmt.Errorf("%s: %d problem(s)", source, len(problems))
	}

	if *printCfg {
		out, err := config.Marshal(cfg.Redacted())
		if err != nil {
			return err
		}
		if _, err := stdout.Write(out); err != nil {
			return fmt.Errorf("writing the configuration: %w", err)
		}
	}
	if len(cfg.Replicas) == 0 && !cfg.Discovery.Enabled() {
		fmt.Fprintln(stderr, "warning: no replicas configured; add them with --replica or through the admin API")
	}
	for _, w := range append(cfg.Warnings(), cfg.Notices()...) {
		fmt.Fprintln(stderr, "warning: "+w)
	}
	prefix := ""
	if *printCfg {
		prefix = "# " // keep the printed YAML valid
	}
	discovered := ""
	if cfg.Discovery.Enabled() {
		discovered = ", discovery " + cfg.Discovery.Type
	}
	fmt.Fprintf(stdout, "%sok: %d replicas, policy %s%s\n", prefix, len(cfg.Replicas), cfg.Routing.Policy, discovered)
	for _, t := range toks.Describe() {
		fmt.Fprintf(stdout, "%stokenizer %s\n", prefix, t)
	}
	return nil
}
