package server

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/simreplica"
	"github.com/llmlb/llmlb/internal/ui"
)

// TestCostDecisionExplainedAlikeEverywhere runs policy cost in front of a
// simulated fleet and checks that each routing decision reads the same on
// the dashboard's event stream, in the debug log's "route" line and, for
// the latest one, in /admin/replicas' last_decision: cost's own words (the
// rule, the expected time to first token against the runner-up's, cached
// tokens, pending prefill), never another policy's pin.
func TestCostDecisionExplainedAlikeEverywhere(t *testing.T) {
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: 2, Model: model, Seed: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := startURLs(t, fleet.URLs(), logger, func(c *config.Config) { c.Routing.Policy = "cost" })

	// Three turns of one conversation: the later ones find the first's
	// prompt cached on its replica.
	system := strings.Repeat("You are a careful assistant who reads the whole document. ", 40)
	const turns = 3
	for i := range turns {
		body := chatBody(system+strings.Repeat(" and one more question", i), 4)
		if code, _, out := e.chat(body, map[string]string{"X-Session-Id": "explain-1"}); code != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, code, out)
		}
	}

	type route struct{ Replica, Policy, Why string }
	var logged []route
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var r struct {
			Msg string `json:"msg"`
			route
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r.Msg == "route" {
			logged = append(logged, r.route)
		}
	}
	decisions := firstSnapshot(t, e).Decisions
	slices.SortFunc(decisions, func(a, b ui.Decision) int { return int(a.Seq) - int(b.Seq) })
	if len(logged) != turns || len(decisions) != turns {
		t.Fatalf("%d route lines and %d dashboard decisions, want %d of each", len(logged), len(decisions), turns)
	}
	byCache := 0
	for i, l := range logged {
		d := decisions[i]
		t.Logf("turn %d on %s: %s", i, d.Replica, d.Why)
		if l.Policy != "cost" || !strings.HasPrefix(l.Why, "by ") || strings.Contains(l.Why, "pin") {
			t.Errorf("turn %d: log says policy %q, why %q; want cost's own words", i, l.Policy, l.Why)
		}
		for _, w := range []string{"expected TTFT", "cached tokens", "pending prefill"} {
			if !strings.Contains(l.Why, w) {
				t.Errorf("turn %d: why %q lacks %q", i, l.Why, w)
			}
		}
		if d.Replica != l.Replica || d.Why != l.Why+" [policy cost]" {
			t.Errorf("turn %d: dashboard and debug log differ:\n ui  %s %q\n log %s %q", i, d.Replica, d.Why, l.Replica, l.Why)
		}
		if strings.HasPrefix(l.Why, "by cache:") {
			byCache++
		}
	}
	if byCache == 0 {
		t.Errorf("no turn was decided by cache; a conversation's later turns should be")
	}
	last := logged[turns-1]
	for _, r := range e.replicas() {
		if r.Name == last.Replica && r.LastDecision != last.Why {
			t.Errorf("/admin/replicas last_decision of %s = %q, want the log's %q", r.Name, r.LastDecision, last.Why)
		}
	}
}

// firstSnapshot reads the first snapshot of the dashboard's event stream.
func firstSnapshot(t *testing.T, e *env) ui.Snapshot {
	t.Helper()
	resp, err := e.http.Get(e.admin + "/admin/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			var snap ui.Snapshot
			if err := json.Unmarshal([]byte(data), &snap); err != nil {
				t.Fatal(err)
			}
			return snap
		}
	}
}
