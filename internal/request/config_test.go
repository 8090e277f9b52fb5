package request

import (
	"strings"
	"testing"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"empty lists", func(c *Config) { c.SessionHeaders, c.SessionBodyFields, c.TenantHeaders = nil, nil, nil }, ""},
		{"bad session header", func(c *Config) { c.SessionHeaders = []string{"x-ok", "x bad"} }, "request.session_headers[1]"},
		{"empty tenant header", func(c *Config) { c.TenantHeaders = []string{""} }, "request.tenant_headers[0]"},
		{"empty body field", func(c *Config) { c.SessionBodyFields = []string{""} }, "request.session_body_fields[0]"},
		{"bad dotted path", func(c *Config) { c.SessionBodyFields = []string{"metadata..id"} }, "request.session_body_fields[0]"},
		{"zero prefix chars", func(c *Config) { c.PrefixChars = 0 }, "request.prefix_chars"},
		{"negative default output", func(c *Config) { c.DefaultOutputTokens = -1 }, "request.default_output_tokens"},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		tt.mod(&cfg)
		err := cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "request: ")):
			t.Errorf("%s: error = %v, want one naming %s", tt.name, err, tt.want)
		}
	}
}
