package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// The flow_control section: on by default, its keys parse from YAML (the
// queue's own directly under flow_control, tenants as a list), Queue hands
// flow control its configuration, and every bad value names its key.
func TestFlowControlSection(t *testing.T) {
	d := Default().FlowControl
	if !d.Enabled || d.MaxQueued != 10_000 || d.MaxQueueTime != time.Minute || d.TenantFrom != TenantFromHeader || !d.PriorityHeader {
		t.Fatalf("defaults: %+v", d)
	}
	c, err := Parse([]byte(`
flow_control:
  max_queued: 50
  max_queue_time: 5s
  tenant:
    max_concurrent: 8
  tenants:
    - name: acme
      max_concurrent: 32
      tokens_per_minute: 600000
  priority_rules:
    - tenant: batch
      priority: -1
  tenant_from: api_key
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	q := c.FlowControl.Queue()
	want := flowcontrol.DefaultConfig()
	want.MaxQueued, want.MaxQueueTime = 50, 5*time.Second
	want.Tenant.MaxConcurrent = 8
	want.Tenants = map[string]flowcontrol.TenantLimits{"acme": {MaxConcurrent: 32, TokensPerMinute: 600_000}}
	want.PriorityRules = []flowcontrol.PriorityRule{{Tenant: "batch", Priority: -1}}
	if d := cmp.Diff(want, q); d != "" {
		t.Errorf("Queue() mismatch (-want +got):\n%s", d)
	}
	if c.FlowControl.TenantFrom != TenantFromAPIKey {
		t.Errorf("tenant_from %q", c.FlowControl.TenantFrom)
	}

	bad := Default()
	bad.FlowControl.MaxQueued = 0
	bad.FlowControl.Tenant.TokensPerMinute = -1
	bad.FlowControl.TenantFrom = "apikey"
	bad.FlowControl.Tenants = []NamedTenant{{Name: "a"}, {Name: "a", TenantLimits: flowcontrol.TenantLimits{MaxConcurrent: -2}},
		{Name: "", TenantLimits: flowcontrol.TenantLimits{TokensPerMinute: -3}}, {Name: strings.Repeat("x", 300)}}
	bad.FlowControl.PriorityRules = []flowcontrol.PriorityRule{{Priority: 2}}
	got := messages(bad.Validate())
	for _, w := range []string{
		`config: flow_control.max_queued: must be >= 1, got 0`,
		`config: flow_control.tenant.tokens_per_minute: must be >= 0, got -1`,
		`config: flow_control.priority_rules[0]: needs model, tenant or api_key`,
		`config: flow_control.tenant_from: "apikey" is not one of header, api_key (did you mean "api_key"?)`,
		`config: flow_control.tenants[1].name: "a" is also the name of flow_control.tenants[0]; list each tenant once`,
		`config: flow_control.tenants[1].max_concurrent: must be >= 0 (0 = no limit), got -2`,
		`config: flow_control.tenants[2].name: empty tenant name`,
		`config: flow_control.tenants[2].tokens_per_minute: must be >= 0 (0 = no limit), got -3`,
		`config: flow_control.tenants[3].name: longer than 256 bytes: no request's tenant can be named so (longer ones are hashed)`,
	} {
		found := false
		for _, g := range got {
			found = found || g == w
		}
		if !found {
			t.Errorf("missing %q in:\n%s", w, strings.Join(got, "\n"))
		}
	}
	if len(got) != 9 {
		t.Errorf("%d errors, want 9:\n%s", len(got), strings.Join(got, "\n"))
	}
}

// A priority rule's api_key is a client's secret: printed redacted.
func TestFlowControlRuleKeyRedacted(t *testing.T) {
	c := Default()
	c.FlowControl.PriorityRules = []flowcontrol.PriorityRule{{APIKey: "sk-very-secret", Priority: 5}}
	yml, err := Marshal(c.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(yml), "very-secret") || c.FlowControl.PriorityRules[0].APIKey != "sk-very-secret" {
		t.Errorf("the key leaked, or Redacted changed the original:\n%s", yml)
	}
}
