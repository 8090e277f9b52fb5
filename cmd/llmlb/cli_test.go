package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/modeltok"
)

func TestResolvePolicy(t *testing.T) {
	cases := []struct{ in, want, err string }{
		{in: "cache_aware", want: "prefix-tree"},
		{in: "round_robin", want: "rr"},
		{in: "consistent_hash", want: "sticky"},
		{in: "least_request", want: "least-request"},
		{in: "Round_Robin", want: "rr"},
		{in: "llmlb-warm", want: "llmlb-warm"}, // our own names pass through
		{in: "bogus", want: "bogus"},           // left to config validation
		{in: "power_of_two", err: "nearest is least-request"},
		{in: "random", err: "nearest is rr"},
	}
	for _, c := range cases {
		got, err := resolvePolicy(c.in)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%s: err %v, want one containing %q", c.in, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%s: %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// TestServePolicyFlagAndEnv: --policy takes aliases; LLMLB_* variables
// stand in for flags not given, and flags win over them.
func TestServePolicyFlagAndEnv(t *testing.T) {
	cfg, err := serveConfig([]string{"--policy", "cache_aware", "--replica", "http://127.0.0.1:8001"}, io.Discard)
	if err != nil || cfg.Routing.Policy != "prefix-tree" {
		t.Fatalf("--policy cache_aware: %q, %v", cfg.Routing.Policy, err)
	}
	if _, err := serveConfig([]string{"--policy", "power_of_two"}, io.Discard); err == nil || !strings.Contains(err.Error(), "least-request") {
		t.Fatalf("--policy power_of_two: %v, want a refusal naming least-request", err)
	}
	if _, err := serveConfig([]string{"--policy", "bogus"}, io.Discard); err == nil || !strings.Contains(err.Error(), "routing.policy") {
		t.Fatalf("--policy bogus: %v, want the config error naming routing.policy", err)
	}

	t.Setenv("LLMLB_POLICY", "round_robin")
	t.Setenv("LLMLB_REPLICA", "a=http://127.0.0.1:8001, b=http://127.0.0.1:8002")
	t.Setenv("LLMLB_LISTEN", "127.0.0.1:18080")
	cfg, err = serveConfig([]string{"--listen", "127.0.0.1:28080"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Routing.Policy != "rr" || len(cfg.Replicas) != 2 || cfg.Replicas[1].Name != "b" || cfg.Listen != "127.0.0.1:28080" {
		t.Fatalf("from the environment: policy %q, replicas %+v, listen %q", cfg.Routing.Policy, cfg.Replicas, cfg.Listen)
	}
	t.Setenv("LLMLB_LOG_LEVEL", "loud")
	if _, err := serveConfig(nil, io.Discard); err == nil || !strings.Contains(err.Error(), "log.level") {
		t.Fatalf("LLMLB_LOG_LEVEL=loud: %v", err)
	}
}

// TestEveryCommandHasHelp: `llmlb <command> -h` prints a usage line naming
// the command and the flags, and exits without error.
func TestEveryCommandHasHelp(t *testing.T) {
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			out := captureStderr(t, func() {
				if err := c.run(context.Background(), []string{"-h"}); err != nil && !errors.Is(err, flag.ErrHelp) {
					t.Errorf("-h: %v", err)
				}
			})
			if !strings.HasPrefix(out, "usage: llmlb "+c.name) || !strings.Contains(out, "flags:") {
				t.Errorf("-h prints:\n%s\nwant \"usage: llmlb %s ...\" and a flags: section", out, c.name)
			}
		})
	}
}

func captureStderr(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stderr
	os.Stderr = w
	done := make(chan string)
	go func() {
		var b bytes.Buffer
		io.Copy(&b, r)
		done <- b.String()
	}()
	defer func() { os.Stderr = old }()
	f()
	w.Close()
	os.Stderr = old
	return <-done
}

// TestValidateWithDiscovery: a file with no static replica but a discovery
// source is fine, and says where replicas come from.
func TestValidateWithDiscovery(t *testing.T) {
	file := t.TempDir() + "/llmlb.yaml"
	if err := os.WriteFile(file, []byte("discovery:\n  type: dns\n  dns:\n    name: vllm.inference.svc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := validateMain([]string{"--config", file}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if stdout.String() != "ok: 0 replicas, policy cost, discovery dns\n" || strings.Contains(stderr.String(), "no replicas") {
		t.Errorf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

// TestNeedRestart: a reload names the changed sections it cannot apply,
// and none when only the replicas, the admin access, routing or the log
// level changed (a routing.policy change is refused by the core itself).
func TestNeedRestart(t *testing.T) {
	a := config.Default()
	b := config.Default()
	b.Replicas = []config.Replica{{Name: "x", URL: "http://127.0.0.1:1"}}
	b.AdminToken = "new"
	if got := needRestart(a, b); len(got) != 0 {
		t.Errorf("replicas and token changed: %v, want nothing", got)
	}
	b.Routing.Affinity.SessionTTL = time.Minute
	b.Log.Level = "debug"
	if got := needRestart(a, b); len(got) != 0 {
		t.Errorf("routing and log level changed: %v, want nothing", got)
	}
	b.Scrape.Interval = time.Second
	b.Discovery.Type = "dns"
	b.Tokenizers = []modeltok.Config{{Models: []string{"m"}, Path: "/models/m"}}
	if d := cmp.Diff([]string{"discovery", "tokenizers", "scrape"}, needRestart(a, b)); d != "" {
		t.Error(d)
	}
}

// TestWatchFile: a change of the file's content is reported (the watcher
// may start after any of the writes, so the test keeps writing new content
// until one is seen; no timing is asserted).
func TestWatchFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "llmlb.yaml")
	if err := os.WriteFile(path, []byte("listen: :8080\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	changes := make(chan struct{}, 1)
	go watchFile(ctx, path, 5*time.Millisecond, func() {
		select {
		case changes <- struct{}{}:
		default:
		}
	})
	deadline := time.After(30 * time.Second)
	for i := 1; ; i++ {
		if err := os.WriteFile(path, []byte(fmt.Sprintf("listen: :%d\n", 8080+i)), 0o600); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changes:
			return
		case <-deadline:
			t.Fatal("no change of the file was reported")
		case <-time.After(20 * time.Millisecond):
		}
	}
}
