package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the README's first command in process for a few seconds: it
// must print the URLs, at least one live summary with every replica, the
// flap, and stop cleanly with its totals.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a simulated fleet for a few seconds")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var out, logs bytes.Buffer
	o := demoOptions{
		replicas: 3, profile: "2x3090-tp2", model: "sim-model",
		listen: "127.0.0.1:0", adminListen: "127.0.0.1:0", users: 4,
		every: time.Second, flapAfter: 2 * time.Second, flapFor: 2 * time.Second,
		flapPeriod: time.Second, logLevel: "warn",
	}
	if err := demo(ctx, o, &out, &logs); err != nil {
		t.Fatalf("demo: %v\n%s\n%s", err, out.String(), logs.String())
	}
	got := out.String()
	for _, want := range []string{"proxy:  http://127.0.0.1:", "/admin/replicas", "replica  state", "sim-1", "sim-3", "starts to flap", "done: "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// TestDemoRejectsUnknownPolicy checks that a bad --policy is an error before
// any replica starts.
func TestDemoRejectsUnknownPolicy(t *testing.T) {
	var out, logs bytes.Buffer
	err := demo(context.Background(), demoOptions{replicas: 1, policy: "nope", logLevel: "warn", every: time.Second}, &out, &logs)
	if err == nil || !strings.Contains(err.Error(), `--policy: policy: unknown policy "nope"`) {
		t.Fatalf("err = %v, want an unknown-policy error", err)
	}
}
