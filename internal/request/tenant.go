package request

import (
	"net/http"
	"strings"
)

// Tenant returns the request's tenant: the first configured tenant
// header's sanitized value (request.tenant_headers), "" when none is set.
// The prefix key is joined with it, and flow control's fair shares and
// limits are per tenant.
func Tenant(cfg Config, header http.Header) string { return tenant(cfg, header) }

// tenant returns the first configured tenant header's sanitized value.
func tenant(cfg Config, header http.Header) string {
	for _, name := range cfg.TenantHeaders {
		for _, v := range header[canonicalHeader(name)] {
			if t := sanitizeKey(v); t != "" {
				return t
			}
		}
	}
	return ""
}

// APIKey returns the client's API key as flow control's priority rules
// match it (flow_control.priority_rules[].api_key): the bearer token of
// Authorization (OpenAI's clients), else x-api-key (Anthropic's); "" when
// neither is set. It is a secret: never log it.
func APIKey(header http.Header) string {
	if auth := strings.TrimSpace(header.Get("Authorization")); len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
		return strings.TrimSpace(auth[7:])
	}
	return strings.TrimSpace(header.Get("X-Api-Key"))
}
