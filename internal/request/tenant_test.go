package request

import (
	"net/http"
	"strings"
	"testing"
)

func TestTenantAndAPIKey(t *testing.T) {
	cfg := DefaultConfig()
	cases := []struct {
		name         string
		header       http.Header
		tenant, key  string
		keyTenantHas string // prefix of KeyTenant(key)
	}{
		{"none", http.Header{}, "", "", ""},
		{"project header", http.Header{"X-Project-Id": {" acme "}}, "acme", "", ""},
		{"bearer", http.Header{"Authorization": {"Bearer sk-1"}}, "", "sk-1", "key:"},
		{"bearer any case", http.Header{"Authorization": {"bearer  sk-2 "}}, "", "sk-2", "key:"},
		{"basic is no key", http.Header{"Authorization": {"Basic dXNlcg=="}, "X-Api-Key": {"sk-3"}}, "", "", ""},
		{"x-api-key", http.Header{"X-Api-Key": {"sk-3"}}, "", "sk-3", "key:"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := Tenant(cfg, c.header); got != c.tenant {
				t.Errorf("Tenant = %q, want %q", got, c.tenant)
			}
			key := APIKey(c.header)
			if key != c.key {
				t.Errorf("APIKey = %q, want %q", key, c.key)
			}
			kt := KeyTenant(key)
			if !strings.HasPrefix(kt, c.keyTenantHas) || (key != "" && (len(kt) != 20 || strings.Contains(kt, key))) {
				t.Errorf("KeyTenant = %q", kt)
			}
		})
	}
	// What docs/CONFIG.md's recipe gives: printf %s sk-1 | sha256sum | cut -c1-16.
	if got := KeyTenant("sk-1"); got != "key:0f2c10bf3d128c71" {
		t.Errorf("KeyTenant(sk-1) = %q", got)
	}
}
