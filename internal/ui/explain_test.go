package ui

import (
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// turn is a request of a session whose prompt repeats the same 40 blocks.
func turn(own int) *request.Profile {
	keys := make([]uint64, 0, 40+own)
	for i := range 40 {
		keys = append(keys, tokenize.KeyOfText("system/"+string(rune('A'+i))))
	}
	for i := range own {
		keys = append(keys, tokenize.KeyOfText("turn/"+string(rune('a'+i))))
	}
	p := tokenize.FromBlockKeys(len(keys)*tokenize.BlockSize, keys)
	return &request.Profile{Model: "m", SessionKey: "sess-1", PrefixKey: "system", PromptTokens: p.Tokens, PromptBlocks: p.Blocks}
}

// TestWhyIsInThePolicysOwnWords: the second turn of a session, routed by
// each policy, is explained by that policy's real reason; the dashboard,
// the debug log's "why" and /admin/replicas' last_decision say the same.
func TestWhyIsInThePolicysOwnWords(t *testing.T) {
	want := map[string][]string{
		policy.NameRR:           {"rotation of 3"},
		policy.NameLeastRequest: {"fewest in flight of 3"},
		policy.NameSticky:       {"session hash of 3"},
		policy.NamePrefixTree:   {"longest prefix match of 3"},
		policy.NameLLMD:         {"highest weighted score of 3"},
		policy.NameLLMLB:        {"session pin on", "used"},
		policy.NameLLMLBWarm:    {"session pin on", "used"},
		policy.NameCost:         {"by cache: ", "expected TTFT", "(runner-up)", "640 cached tokens", "pending prefill"},
	}
	for _, name := range policy.Names() {
		t.Run(name, func(t *testing.T) {
			words, ok := want[name]
			if !ok {
				t.Fatalf("policy %s has no expected explanation in this test", name)
			}
			cfg := balancer.DefaultConfig()
			cfg.Policy = name
			bal, err := balancer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range []string{"a", "b", "c"} {
				if err := bal.AddReplica(balancer.ReplicaSpec{Name: r, URL: "http://" + r}, t0); err != nil {
					t.Fatal(err)
				}
				bal.ObserveScrape(r, balancer.Snapshot{}, nil, t0)
			}
			d := New(Options{Balancer: bal, Now: (&clock{t: t0}).now})
			route(t, d, bal, turn(0), t0)
			res, err := bal.Select(turn(2), t0)
			if err != nil {
				t.Fatal(err)
			}
			d.Decision(t0, res, turn(2), 1)
			bal.Release(res, balancer.OutcomeOK, t0)

			why := d.Snapshot(t0).Decisions[0].Why
			for _, w := range words {
				if !strings.Contains(why, w) {
					t.Errorf("why %q lacks %q", why, w)
				}
			}
			if !strings.HasSuffix(why, "[policy "+name+"]") {
				t.Errorf("why %q does not name policy %s", why, name)
			}
			var logWhy string
			for _, a := range res.Explanation.LogAttrs() {
				if a.Key == "why" {
					logWhy = a.Value.String()
				}
			}
			if why != logWhy+" [policy "+name+"]" {
				t.Errorf("dashboard and debug log differ:\n ui  %q\n log %q", why, logWhy)
			}
			for _, st := range bal.Replicas(t0) {
				if st.Name == res.Replica && st.LastDecision != logWhy {
					t.Errorf("/admin/replicas last_decision %q, want the log's %q", st.LastDecision, logWhy)
				}
			}
		})
	}
}
