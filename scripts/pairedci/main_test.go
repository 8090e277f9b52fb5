package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// logOf writes a request log of n requests, one a second, answered by each
// policy with the TTFT ttft(policy, i) and cached(policy, i) of 100 tokens.
func logOf(n int, policies []string, ttft func(p string, i int) float64, cached func(p string, i int) int) string {
	var b strings.Builder
	b.WriteString("policy,request,session,turn,arrival_seconds,replica,prompt_tokens,cached_tokens,output_tokens,ttft_seconds,e2e_seconds,finished,expected_cached_tokens,expected_ttft_seconds,priority,sent_seconds,tenant\n")
	for _, p := range policies {
		for i := range n {
			fmt.Fprintf(&b, "%s,%d,,1,%d.000000,replica-1,100,%d,10,%f,1.0,true,0,0,0,0,\n", p, i+1, i, cached(p, i), ttft(p, i))
		}
	}
	return b.String()
}

func compareLog(t *testing.T, log, ours string) map[string]comparison {
	t.Helper()
	r, err := readRun(strings.NewReader(log), 5)
	if err != nil {
		t.Fatal(err)
	}
	cmps, err := r.compare(ours, 200, 0.95, 1)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]comparison{}
	for _, c := range cmps {
		out[c.Other] = c
	}
	return out
}

func TestPairedComparison(t *testing.T) {
	log := logOf(600, []string{"cost", "same", "slower", "noisy"},
		func(p string, i int) float64 {
			base := 0.1 + float64(i%37)/37 // every block a spread of latencies
			switch p {
			case "slower":
				return 2 * base
			case "noisy": // the same distribution, paired differently
				return 0.1 + float64((i*7)%37)/37
			}
			return base
		},
		func(p string, i int) int {
			if p == "slower" {
				return 20
			}
			return 30
		})
	got := compareLog(t, log, "cost")
	if c := got["same"]; c.P99.point != 1 || c.P99.lo != 1 || c.P99.hi != 1 || c.P99.verdict(1) != "tie" || c.Hit.verdict(0) != "tie" {
		t.Errorf("against an identical run: %+v, want ratio 1 in [1, 1], a tie", c)
	}
	if c := got["slower"]; math.Abs(c.P50.point-0.5) > 1e-5 || c.P99.verdict(1) != "lower" || c.P50.verdict(1) != "lower" {
		t.Errorf("against a run twice as slow: %+v, want p50 ratio 0.5, both lower", c)
	}
	if c := got["slower"]; c.Hit.verdict(0) != "higher" || c.Hit.point < 0.0999 || c.Hit.point > 0.1001 {
		t.Errorf("hit rate against 20%%: %+v, want +10 points, higher", c.Hit)
	}
	if c := got["noisy"]; c.P99.verdict(1) != "tie" {
		t.Errorf("against the same latencies in another order: %+v, want a tie", c.P99)
	}
}

func TestBadLogs(t *testing.T) {
	for name, log := range map[string]string{
		"not a request log": "a,b\n1,2\n",
		"one policy":        logOf(10, []string{"cost"}, func(string, int) float64 { return 1 }, func(string, int) int { return 0 }),
		"arrival too far":   strings.Replace(logOf(3, []string{"a", "b"}, func(string, int) float64 { return 1 }, func(string, int) int { return 0 }), ",1,,1,0.000000,", ",1,,1,1e12,", 1),
		"bad number":        strings.Replace(logOf(3, []string{"a", "b"}, func(string, int) float64 { return 1 }, func(string, int) int { return 0 }), "1.000000,1.0", "x,1.0", 1),
	} {
		if _, err := readRun(strings.NewReader(log), 5); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	r, err := readRun(strings.NewReader(logOf(10, []string{"a", "b"}, func(string, int) float64 { return 1 }, func(string, int) int { return 0 })), 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.compare("cost", 100, 0.95, 1); err == nil || !strings.Contains(err.Error(), "a, b") {
		t.Errorf("an unknown policy: %v, want an error naming the run's", err)
	}
}
