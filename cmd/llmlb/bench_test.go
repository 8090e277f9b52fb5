package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/bench"
	"github.com/llmlb/llmlb/internal/workload"
)

func TestBenchFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"workload and trace", []string{"--workload", "chat", "--trace", "x.jsonl"}, "exclude each other"},
		{"bad flap", []string{"--flap", "replica-1"}, "NAME:PERIOD"},
		{"stray argument", []string{"extra"}, "unexpected argument"},
		{"bad duration", []string{"--duration", "soon"}, "invalid value"},
		{"no replicas", []string{"--replicas", "0"}, "at least 1"},
		{"no balancers", []string{"--balancers", "0"}, "--balancers 0: need at least 1"},
		{"no share delay", []string{"--balancers", "2", "--share-delay", "0s"}, "--share-delay 0s: must be > 0"},
		{"no policies", []string{"--policies", " , "}, "at least one policy"},
		{"unknown profile", []string{"--profile", "tpu-v9"}, "tpu-v9"},
		{"unknown workload", []string{"--workload", "gaming"}, "gaming"},
		{"unknown policy", []string{"--policies", "random", "--duration", "1m"}, "random"},
		{"missing trace", []string{"--trace", "/nonexistent/trace.jsonl"}, "no such file"},
		{"negative trace limit", []string{"--trace", "../../traces/azure_llm_inference_2023_code.csv", "--trace-limit", "-1"}, "negative limit -1"},
		{"unwritable report", []string{"--html", "/nonexistent/dir/r.html", "--duration", "1m"}, "no such file"},
		{"unwritable request log", []string{"--requests", "/nonexistent/dir/r.csv", "--duration", "1m"}, "no such file"},
		{"bad flow control", []string{"--flow-control", "maybe"}, "--flow-control \"maybe\": on or off"},
		{"no speed", []string{"--speed", "0"}, "--speed 0: must be a number > 0"},
		{"priority mix past 1", []string{"--priority-mix", "0.8,0.5"}, "--priority-mix \"0.8,0.5\""},
		{"priority mix of one share", []string{"--priority-mix", "0.1"}, "want HIGH,SHED"},
		{"no queue time", []string{"--max-queue-time", "0s"}, "max_queue_time"},
		{"speed and users", []string{"--workload", "chat", "--users", "5", "--speed", "2"}, "no rate to speed up"},
		{"unknown +fc policy", []string{"--policies", "magic+fc", "--duration", "1m"}, "magic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := benchMain(context.Background(), tt.args, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestBenchHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := benchMain(context.Background(), []string{"-h"}, &stdout, &stderr)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, f := range []string{"--workload", "--trace", "--trace-limit", "--policies", "--replicas", "--profile", "--duration", "--seed", "--json", "--html", "--requests", "--session-ttl", "--token-unit"} {
		if !strings.Contains(stderr.String(), strings.TrimPrefix(f, "-")) {
			t.Errorf("help lacks %s", f)
		}
	}
}

func TestBenchTraceLimit(t *testing.T) {
	// Five requests a second apart; --trace-limit 2 replays the first two
	// to arrive.
	path := filepath.Join(t.TempDir(), "azure.csv")
	trace := "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	for i := range 5 {
		trace += fmt.Sprintf("%d,100,5\n", 10-i) // out of order: the first two are 6 and 7
	}
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := benchMain(context.Background(), []string{"--trace", path, "--trace-limit", "2", "--policies", "rr", "--json", "--quiet"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Requests int `json:"requests"`
		} `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("%v in %s", err, stdout.String())
	}
	if len(rep.Results) != 1 || rep.Results[0].Requests != 2 {
		t.Errorf("results %+v, want one policy with 2 requests", rep.Results)
	}
}

// TestBenchPrintsTraceSummary: before a trace run, bench says on stderr what
// it replays, and how many rows it skipped.
func TestBenchPrintsTraceSummary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "burst.csv")
	trace := "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" +
		"1,ChatGPT,100,5,105,API log\n2,ChatGPT,0,5,5,API log\n3,ChatGPT,0,5,5,API log\n61,ChatGPT,200,5,205,API log\n"
	if err := os.WriteFile(path, []byte(trace), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := benchMain(context.Background(), []string{"--trace", path, "--policies", "rr", "--json"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if want := "trace burst.csv (burstgpt): 2 requests over 1m0s; 2 rows skipped (0 request tokens)\n"; !strings.HasPrefix(stderr.String(), want) {
		t.Errorf("stderr starts %q, want %q", stderr.String(), want)
	}
	stderr.Reset()
	if err := benchMain(context.Background(), []string{"--trace", path, "--policies", "rr", "--json", "--quiet"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if stderr.Len() != 0 {
		t.Errorf("--quiet wrote %q to stderr", stderr.String())
	}
}

// fakeTrace is a finished list of arrivals for traceSpan.
type fakeTrace struct{ at []time.Duration }

func (f *fakeTrace) Peek() (time.Duration, bool) {
	if len(f.at) == 0 {
		return 0, false
	}
	return f.at[0], true
}
func (f *fakeTrace) Pop() *workload.Request {
	r := &workload.Request{At: f.at[0]}
	f.at = f.at[1:]
	return r
}
func (f *fakeTrace) Complete(*workload.Request, time.Duration) {}
func (f *fakeTrace) Done() bool                                { return len(f.at) == 0 }

func TestTraceSpan(t *testing.T) {
	tests := []struct {
		name string
		at   []time.Duration
		want time.Duration
	}{
		{"rounds up to a minute", []time.Duration{0, 16*time.Minute + 59*time.Second}, 17 * time.Minute},
		{"just past a minute", []time.Duration{0, 17 * time.Minute}, 18 * time.Minute},
		{"empty", nil, time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := traceSpan(&fakeTrace{at: tt.at}); got != tt.want {
				t.Fatalf("traceSpan = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestBenchEndToEnd runs the command on a small fleet: JSON on stdout that
// parses back, an HTML report with SVG charts, and a request log with a
// row for every finished or unfinished request.
func TestBenchEndToEnd(t *testing.T) {
	html := filepath.Join(t.TempDir(), "report.html")
	requests := filepath.Join(t.TempDir(), "requests.csv")
	var stdout, stderr bytes.Buffer
	args := []string{"--workload", "chat", "--replicas", "2", "--duration", "2m", "--policies", "rr,llmlb",
		"--json", "--html", html, "--requests", requests, "--quiet", "--session-slack", "2"}
	if err := benchMain(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	rep, err := bench.ReadJSON(&stdout)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replicas != 2 || len(rep.Results) != 2 || rep.Results[1].Policy != "llmlb" || rep.Results[0].Requests == 0 {
		t.Fatalf("unexpected report: %+v", rep)
	}
	page, err := os.ReadFile(html)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(page, []byte("<svg")) {
		t.Fatal("HTML report has no <svg>")
	}
	log, err := os.ReadFile(requests)
	if err != nil {
		t.Fatal(err)
	}
	want := 1 // the header
	for _, r := range rep.Results {
		want += r.Finished + r.Unfinished
	}
	if got := bytes.Count(log, []byte("\n")); got != want || !bytes.HasPrefix(log, []byte("policy,request,session,")) {
		t.Fatalf("request log: %d lines, want %d; starts %q", got, want, log[:min(len(log), 60)])
	}
}

// TestBenchFlowControlEndToEnd: the flood workload with a priority mix at
// 1.5x, with and without flow control: the report says the speed and the
// mix, and has the per-tenant, per-priority and flow-control figures.
func TestBenchFlowControlEndToEnd(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"--workload", "flood", "--replicas", "2", "--duration", "2m", "--policies", "cost,cost+fc",
		"--priority-mix", "0.2,0.2", "--speed", "1.5", "--json", "--quiet"}
	if err := benchMain(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr.String())
	}
	rep, err := bench.ReadJSON(&stdout)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Speed != 1.5 || rep.PriorityMix != "0.2,0.2" || len(rep.Results) != 2 {
		t.Fatalf("speed %v, mix %q, %d results", rep.Speed, rep.PriorityMix, len(rep.Results))
	}
	plain, fc := rep.Results[0], rep.Results[1]
	if plain.FlowControl != nil || fc.FlowControl == nil || fc.FlowControl.Queued == 0 {
		t.Errorf("flow control: without %+v, with %+v", plain.FlowControl, fc.FlowControl)
	}
	for _, r := range rep.Results {
		if len(r.Tenants) != 4 || len(r.Priorities) != 3 || r.TenantFairness <= 0 {
			t.Errorf("%s: tenants %+v, priorities %+v, fairness %v", r.Policy, r.Tenants, r.Priorities, r.TenantFairness)
		}
	}
}

// TestBenchSpeedMultipliesTraceSpeed: --speed compresses a trace on top of
// --trace-speed.
func TestBenchSpeedMultipliesTraceSpeed(t *testing.T) {
	run := func(args ...string) *bench.Report {
		t.Helper()
		var stdout, stderr bytes.Buffer
		args = append([]string{"--trace", "../../traces/azure_llm_inference_2023_code.csv", "--trace-limit", "300",
			"--policies", "rr", "--json", "--quiet"}, args...)
		if err := benchMain(context.Background(), args, &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		rep, err := bench.ReadJSON(&stdout)
		if err != nil {
			t.Fatal(err)
		}
		rep.Results[0].WallSeconds, rep.Results[0].SimulatedSecPerWall = 0, 0
		return rep
	}
	a, b := run("--trace-speed", "2", "--speed", "1.5"), run("--trace-speed", "3")
	if a.Speed != 1.5 || b.Speed != 0 {
		t.Fatalf("speeds %v and %v", a.Speed, b.Speed)
	}
	a.Speed = 0
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Errorf("--trace-speed 2 --speed 1.5 differs from --trace-speed 3")
	}
}
