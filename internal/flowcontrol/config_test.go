package flowcontrol

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	cases := []struct {
		name string
		edit func(*Config)
		want string // substring of the error; "" for valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"max_queued", func(c *Config) { c.MaxQueued = 0 }, "flowcontrol: flow_control.max_queued: must be >= 1, got 0"},
		{"max_queued_bytes", func(c *Config) { c.MaxQueuedBytes = -1 }, "flow_control.max_queued_bytes: must be >= 1"},
		{"max_queue_time", func(c *Config) { c.MaxQueueTime = 0 }, "flow_control.max_queue_time: must be > 0"},
		{"max_tenants", func(c *Config) { c.MaxTenants = 0 }, "flow_control.max_tenants: must be >= 1"},
		{"tenant max_concurrent", func(c *Config) { c.Tenant.MaxConcurrent = -1 }, "flow_control.tenant.max_concurrent: must be >= 0"},
		{"tenant tokens_per_minute", func(c *Config) { c.Tenant.TokensPerMinute = -5 }, "flow_control.tenant.tokens_per_minute: must be >= 0"},
		{"named tenant", func(c *Config) { c.Tenants = map[string]TenantLimits{"acme": {MaxConcurrent: -1}} },
			"flow_control.tenants.acme.max_concurrent: must be >= 0"},
		{"empty rule", func(c *Config) { c.PriorityRules = []PriorityRule{{Model: "m"}, {Priority: 3}} },
			"flow_control.priority_rules[1]: needs model, tenant or api_key"},
		{"limits and rules", func(c *Config) {
			c.Tenant = TenantLimits{MaxConcurrent: 8, TokensPerMinute: 100_000}
			c.PriorityRules = []PriorityRule{{Tenant: "batch", Priority: -1}}
		}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := DefaultConfig()
			c.edit(&cfg)
			err := cfg.Validate()
			switch {
			case c.want == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Errorf("got %v, want %q", err, c.want)
			}
		})
	}
}

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	if !c.Enabled || c.MaxQueued != 10_000 || c.MaxQueuedBytes != 256<<20 || c.MaxQueueTime != 60*time.Second ||
		c.DefaultPriority != 0 || !c.PriorityHeader || c.Tenant != (TenantLimits{}) {
		t.Errorf("defaults: %+v", c)
	}
}

func TestPriority(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DefaultPriority = 1
	cfg.MaxHeaderPriority = 10
	cfg.PriorityRules = []PriorityRule{
		{Model: "big", Tenant: "batch", Priority: -2},
		{Tenant: "batch", Priority: -1},
		{APIKey: "sk-vip", Priority: 10},
	}
	noHeader := cfg
	noHeader.PriorityHeader = false
	capped := cfg
	capped.MaxHeaderPriority = 0 // the default: the header only lowers
	cases := []struct {
		name                       string
		cfg                        Config
		model, tenant, key, header string
		want                       int
		wantErr                    error
	}{
		{"default", cfg, "m", "t", "", "", 1, nil},
		{"header", cfg, "m", "t", "", " 5 ", 5, nil},
		{"negative header", cfg, "m", "t", "", "-3", -3, nil},
		{"bad header falls back", cfg, "m", "t", "", "high", 1, ErrBadPriority},
		{"rule on model and tenant", cfg, "big", "batch", "", "", -2, nil},
		{"rule on tenant", cfg, "small", "batch", "", "", -1, nil},
		{"rule beats header", cfg, "m", "batch", "", "9", -1, nil},
		{"rule on api key", cfg, "m", "t", "sk-vip", "", 10, nil},
		{"first match wins", cfg, "m", "batch", "sk-vip", "", -1, nil},
		{"header off", noHeader, "m", "t", "", "9", 1, nil},
		{"header capped at max_header_priority", capped, "m", "t", "", "1000", 0, nil},
		{"header lowers under the cap", capped, "m", "t", "", "-1", -1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.cfg.Priority(c.model, c.tenant, c.key, c.header)
			if got != c.want || !errors.Is(err, c.wantErr) {
				t.Errorf("got %d, %v; want %d, %v", got, err, c.want, c.wantErr)
			}
		})
	}
}
