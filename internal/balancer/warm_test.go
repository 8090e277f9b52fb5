package balancer

import (
	"testing"

	"github.com/llmlb/llmlb/internal/policy"
)

// TestWarmPolicy covers the pin test in which llmlb-warm differs from llmlb:
// the queue is the replica's scraped one and the load gap is counted in
// requests (max(scraped running, in-flight count)) against force_rebind_gap,
// so a session's own parallel burst and long prompts do not break its pin;
// a real queue or the gap still do.
func TestWarmPolicy(t *testing.T) {
	warm := func(c *Config) { c.Policy = policy.NameLLMLBWarm }
	tests := []struct {
		name   string
		policy func(*Config)
		steps  []ev
	}{
		{"llmlb: a burst's second request spills (unscraped in-flight counts as queue)", nil, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity},
			{op: "select", sess: "s1", want: "b", pin: "spill: queue"},
		}},
		{"llmlb-warm: a burst stays on its pin below the force-rebind gap, then moves", warm, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity, pin: "session used"},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity, pin: "session used"},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity, pin: "session used"},
			{op: "select", sess: "s1", want: "b", pin: "session force rebind"},
			{op: "pinned", sess: "s1", want: "b"},
		}},
		{"llmlb: long prompts break the pin at once (30K tokens weigh 30)", nil, []ev{
			{op: "select", sess: "s1", tokens: 30_000, want: "a", release: true},
			{op: "select", sess: "s1", tokens: 30_000, want: "a", reason: ReasonAffinity},
			{op: "select", sess: "s1", tokens: 30_000, want: "b"},
		}},
		{"llmlb-warm: long prompts weigh one request in the pin test", warm, []ev{
			{op: "select", sess: "s1", tokens: 30_000, want: "a", release: true},
			{op: "select", sess: "s1", tokens: 30_000, want: "a", reason: ReasonAffinity},
			{op: "select", sess: "s1", tokens: 30_000, want: "a", reason: ReasonAffinity},
		}},
		{"llmlb-warm: on busy replicas the pin holds below rebind_ratio * mean running", warm, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 59}, {op: "scrape", r: "b", run: 20},
			{op: "select", sess: "s1", want: "a", reason: ReasonAffinity, pin: "session used"}, // 59 < 1.5 * mean(59, 20) = 59.25
			{op: "scrape", r: "a", run: 60},
			{op: "select", sess: "s1", want: "b", pin: "session force rebind"}, // 60 >= 1.5 * mean(60, 20) = 60
		}},
		{"llmlb: the same pin is moved at a gap of 3", nil, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 23}, {op: "scrape", r: "b", run: 20},
			{op: "select", sess: "s1", want: "b", pin: "session force rebind"},
		}},
		{"llmlb-warm: prefix pins keep llmlb's rule (slack 0, released harder)", warm, []ev{
			{op: "select", pfx: "p1", want: "a", release: true},
			{op: "select", pfx: "p1", want: "a", reason: ReasonAffinity, pin: "prefix used"},
			{op: "select", pfx: "p1", want: "b", pin: "prefix spill: queue"},
		}},
		{"llmlb-warm: a queue the replica reports still breaks the pin", warm, []ev{
			{op: "select", sess: "s1", want: "a", release: true},
			{op: "scrape", r: "a", run: 1, wait: 1},
			{op: "select", sess: "s1", want: "b", pin: "spill: queue"},
		}},
		{"llmlb-warm: least-loaded choice still weighs tokens", warm, []ev{
			{op: "select", tokens: 100_000, want: "a"},
			{op: "scrape", r: "a", run: 1}, {op: "scrape", r: "b", run: 5},
			{op: "select", want: "b"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newFleet(t, 2, tc.policy)
			if tc.policy != nil && b.Policy() != policy.NameLLMLBWarm {
				t.Fatalf("policy %s", b.Policy())
			}
			play(t, b, tc.steps)
		})
	}
}
