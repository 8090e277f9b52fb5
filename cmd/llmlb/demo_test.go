package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/testutil/syncbuf"
	"github.com/llmlb/llmlb/internal/traffic"
	"github.com/llmlb/llmlb/internal/ui"
)

// syncBuffer is a goroutine-safe buffer (package syncbuf).
type syncBuffer = syncbuf.Buffer

// testDemoOptions are the flags' defaults, on free loopback ports, with a
// log file in dir.
func testDemoOptions(t *testing.T) demoOptions {
	var o demoOptions
	if err := demoFlags(&o, &bytes.Buffer{}).Parse(nil); err != nil {
		t.Fatal(err)
	}
	o.listen, o.adminListen = "127.0.0.1:0", "127.0.0.1:0"
	o.logFile = filepath.Join(t.TempDir(), "demo.log")
	o.users = 6
	return o
}

// TestDemoScreenShowsTheFlapEpisodeWithinAMinute runs the README's first
// command in process as on a terminal (the redrawn screen, rendered into a
// buffer) with the default timings: the /ui URL comes first, the screen
// shows every replica, decisions per second and, within the first 60 s of
// the demo's own clock, the whole episode "sim-4 flapping -> EJECTED -> ...
// -> LIVE"; logs go to the named file; it stops cleanly. The deadline is
// generous (90 s of wall time); the assertion is on the demo's clock.
func TestDemoScreenShowsTheFlapEpisodeWithinAMinute(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a simulated fleet for about 40 s")
	}
	o := testDemoOptions(t)
	o.plain = false // as on a terminal
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- demo(ctx, o, &out) }()

	const complete = "ejection to LIVE in"
	for !strings.Contains(out.String(), complete) && ctx.Err() == nil {
		select {
		case err := <-done:
			t.Fatalf("demo ended early: %v\n%s", err, out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("demo: %v", err)
	}
	got := out.String()
	frames := strings.Split(got, ansiHome)
	if len(frames) < 3 || !strings.HasPrefix(got, ansiClear) {
		t.Fatalf("want a screen redrawn in place (%d frames):\n%q", len(frames), got)
	}
	var last string
	for _, f := range frames {
		if strings.Contains(f, complete) {
			last = f
			break
		}
	}
	if last == "" {
		t.Fatalf("no frame shows the whole flap episode within %s of wall time; last frame:\n%s", 90*time.Second, frames[len(frames)-1])
	}
	plain := regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`).ReplaceAllString(last, "")
	if !strings.HasPrefix(plain, "llmlb demo   dashboard http://127.0.0.1:") || !strings.Contains(plain[:80], "/ui") {
		t.Errorf("the screen does not start with the /ui URL:\n%s", plain)
	}
	for _, want := range []string{"replica", "sim-1", "sim-2", "sim-3", "sim-4", "decisions/s ", "logs " + o.logFile} {
		if !strings.Contains(plain, want) {
			t.Errorf("screen lacks %q:\n%s", want, plain)
		}
	}
	ep := regexp.MustCompile(`episode +sim-4 flapping \(\d+:\d\d\) -> EJECTED \(\d+:\d\d\)( -> \w+ \(\d+:\d\d\))*( -> \.\.\.)?( -> \w+ \(\d+:\d\d\))* -> LIVE \((\d+):(\d\d)\): ejection to LIVE in`).FindStringSubmatch(plain)
	if ep == nil {
		t.Fatalf("no episode line EJECTED ... -> LIVE:\n%s", plain)
	}
	if min, sec := ep[len(ep)-2], ep[len(ep)-1]; min != "0" && !(min == "1" && sec == "00") {
		t.Errorf("sim-4 back LIVE at %s:%s, want within the first minute:\n%s", min, sec, plain)
	}
	if !strings.Contains(got, "done: ") || !strings.Contains(got, ansiShowCursor) {
		t.Errorf("the demo did not stop cleanly:\n%q", got[max(0, len(got)-300):])
	}
	logs, err := os.ReadFile(o.logFile)
	if err != nil || !bytes.Contains(logs, []byte("replica state changed")) {
		t.Errorf("log file %s: %v, %d bytes, want the state changes", o.logFile, err, len(logs))
	}
	if strings.Contains(got, "level=") {
		t.Errorf("log lines reached the screen")
	}
}

// TestDemoPlain checks --plain: the /ui URL first, then one line per tick
// with every replica and the episode, and the totals at the end.
func TestDemoPlain(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a simulated fleet for a few seconds")
	}
	o := testDemoOptions(t)
	o.plain, o.replicas = true, 3
	o.flapAfter, o.flapFor, o.flapPeriod = 2*time.Second, 2*time.Second, time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
	defer cancel()
	var out syncBuffer
	if err := demo(ctx, o, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	got := out.String()
	if !strings.HasPrefix(got, "llmlb demo: dashboard http://127.0.0.1:") || !strings.Contains(strings.SplitN(got, "\n", 2)[0], "/ui") {
		t.Errorf("the first line is not the /ui URL:\n%s", got)
	}
	if strings.Contains(got, "\x1b[") {
		t.Errorf("--plain wrote ANSI sequences:\n%q", got)
	}
	ticks := regexp.MustCompile(`(?m)^\[0:0\d\] [\d.]+ decisions/s, \d+ requests \(\d+ failed(: [^)]*)?\) \| sim-1 \w+ \d+% \| sim-2 \w+ \d+% \| sim-3 \w+ \d+% \| episode: sim-3 `).FindAllString(got, -1)
	if len(ticks) < 3 {
		t.Errorf("want a line per tick with every replica and the episode, got %d:\n%s", len(ticks), got)
	}
	// Traffic waits for the replicas' first scrapes: nothing fails before
	// the flap (a replica never seen healthy takes no traffic).
	if first := regexp.MustCompile(`(?m)^\[0:01\] .*requests \((\d+) failed[:)]`).FindStringSubmatch(got); first == nil || first[1] != "0" {
		t.Errorf("requests failed in the first second, before any fault:\n%s", got)
	}
	for _, want := range []string{"logs   " + o.logFile, "sim-3 flapping (0:0", "done: "} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}

// TestDemoScreenModel renders one screen from a fixed snapshot: the table,
// the colour-coded states written out, decisions per second and the episode.
func TestDemoScreenModel(t *testing.T) {
	start := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return start.Add(time.Duration(s) * time.Second) }
	hit := 0.91
	snap := &ui.Snapshot{
		Fleet: ui.Fleet{RequestsPerSecond: 8.8, TTFTp50Seconds: 0.055, TTFTp99Seconds: 1.25, ImbalanceIndex: 1.02},
		Replicas: []ui.Replica{
			{ReplicaStatus: balancer.ReplicaStatus{Name: "sim-1", State: "LIVE", EffectiveRunning: 3, Running: 2, Waiting: 1, Load: 3.5, InFlight: 2, KVCacheUsage: 0.04},
				StateSeconds: 34, PrefixHitRate: &hit, Share: 0.27},
			{ReplicaStatus: balancer.ReplicaStatus{Name: "sim-2", State: "EJECTED", Ejections: 1, Draining: true},
				StateSeconds: 5, CooldownLeftSeconds: 5, Share: 0.11},
		},
		// Newest first, as in a snapshot; another replica's transition is ignored.
		Transitions: []ui.Transition{
			{At: at(34), Replica: "sim-2", From: "PROBING", To: "LIVE", Cause: "clean window"},
			{At: at(30), Replica: "sim-1", From: "LIVE", To: "EJECTED", Cause: "scrape failed"},
			{At: at(23), Replica: "sim-2", From: "EJECTED", To: "PROBING", Cause: "2 scrapes ok"},
			{At: at(11), Replica: "sim-2", From: "LIVE", To: "EJECTED", Cause: "scrape failed: connection refused"},
			{At: at(2), Replica: "sim-2", From: "LIVE", To: "EJECTED", Cause: "before the flap"},
		},
	}
	ep := &episode{victim: "sim-2", after: 10 * time.Second, period: 8 * time.Second, length: 10 * time.Second}
	sc := &demoScreen{ui: "http://127.0.0.1:9090/ui", proxy: "http://127.0.0.1:8080", admin: "http://127.0.0.1:9090",
		logPath: "/tmp/demo.log", policy: "llmlb", profile: "2x3090-tp2", model: "m", users: 12, replicas: 2,
		ansi: true, start: start, episode: ep}

	if got := ep.line(func(s string) string { return s }); got != "sim-2 starts to flap at 0:10 (down/up every 8s for 10s)" {
		t.Errorf("before the flap: %q", got)
	}
	ep.flapping(10 * time.Second)
	ep.observe(start, snap.Transitions[2:])
	if got := ep.line(func(s string) string { return s }); got != "sim-2 flapping (0:10) -> EJECTED (0:11) -> PROBING (0:23)" {
		t.Errorf("during the flap: %q", got)
	}
	ep.recovered(20 * time.Second)
	ep.observe(start, snap.Transitions)
	ep.observe(start, snap.Transitions) // seen twice, counted once

	var b bytes.Buffer
	sc.writeScreen(&b, frame{elapsed: 35 * time.Second, snap: snap})
	got := b.String()
	if !strings.HasPrefix(got, ansiHome+"llmlb demo   dashboard http://127.0.0.1:9090/ui   0:35 elapsed") || !strings.HasSuffix(got, ansiClearBelow) {
		t.Errorf("not one screen drawn from the top:\n%q", got)
	}
	for _, want := range []string{
		"sim-1    \x1b[32mLIVE     \x1b[0m     0:34        2        1      3.5         2       4%         91%    27%         0",
		"sim-2    \x1b[1;31mEJECTED  \x1b[0m     0:05        0        0      0.0         0       0%           -    11%         1  cooldown 0:05 left",
		"decisions/s 8.8   requests 0 (ok 0, failed 0)   TTFT p50 55ms p99 1.25s   imbalance 1.02",
		"episode     sim-2 flapping (0:10) -> \x1b[1;31mEJECTED\x1b[0m (0:11) -> \x1b[33mPROBING\x1b[0m (0:23) -> \x1b[32mLIVE\x1b[0m (0:34): ejection to LIVE in 23s",
		"last event  0:34 sim-2 PROBING -> LIVE: clean window",
		"logs /tmp/demo.log",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("screen lacks\n%q\nin\n%s", want, got)
		}
	}
}

// TestDemoHelp checks that -h explains the demo, not just its flags.
func TestDemoHelp(t *testing.T) {
	var o demoOptions
	var out bytes.Buffer
	err := demoFlags(&o, &out).Parse([]string{"-h"})
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"usage: llmlb demo [flags]", "EJECTED -> PROBING -> LIVE", "/ui", "-plain", "-log-file", "examples:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDemoRejectsUnknownPolicy checks that a bad --policy is an error before
// any replica starts.
func TestDemoRejectsUnknownPolicy(t *testing.T) {
	o := testDemoOptions(t)
	o.policy = "nope"
	err := demo(context.Background(), o, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), `--policy: policy: unknown policy "nope"`) {
		t.Fatalf("err = %v, want an unknown-policy error", err)
	}
}

// TestDemoFailureNote: the status line says what the failed requests were.
func TestDemoFailureNote(t *testing.T) {
	tests := []struct {
		name string
		sum  traffic.Summary
		want string
	}{
		{"none failed", traffic.Summary{Requests: 10, OK: 10, ByStatus: map[int]int{200: 10}}, ""},
		{"streams cut by the flap, a 503 and a refused connection", traffic.Summary{Requests: 20, OK: 12, Failed: 8,
			ByStatus: map[int]int{0: 1, 200: 17, 503: 2},
			Errors: map[string]int{
				`traffic: stream error event: {"error":{"message":"upstream broke"}}`:    4,
				"traffic: stream ended without [DONE]":                                   1,
				"Post \"http://127.0.0.1:8080/v1/chat/completions\": connection refused": 1,
			}},
			": 5 cut mid-stream, 2 HTTP 503, 1 no answer"},
	}
	for _, tt := range tests {
		if got := failureNote(tt.sum); got != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.want)
		}
	}
	var b bytes.Buffer
	sc := &demoScreen{}
	sc.writeLine(&b, frame{elapsed: time.Minute, snap: &ui.Snapshot{}, traffic: tests[1].sum})
	if want := "20 requests (8 failed: 5 cut mid-stream, 2 HTTP 503, 1 no answer)"; !strings.Contains(b.String(), want) {
		t.Errorf("status line %q lacks %q", b.String(), want)
	}
}
