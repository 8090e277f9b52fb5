package request

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

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

// Tenant returns the request's tenant as request.tenant_headers find it:
// the first configured header's sanitized value, "" when none is set.
func Tenant(cfg Config, header http.Header) string { return tenant(cfg, header) }

// APIKey returns the client's API key: the bearer token of Authorization,
// else X-Api-Key (the Anthropic Messages API's header); "" when neither.
func APIKey(header http.Header) string {
	if v := header.Get("Authorization"); v != "" {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:])
		}
		return ""
	}
	return strings.TrimSpace(header.Get("X-Api-Key"))
}

// KeyTenantPrefix starts the tenant name KeyTenant derives from an API key.
const KeyTenantPrefix = "key:"

// KeyTenant names the tenant of an API key without revealing the key (the
// name shows in metrics, logs and the dashboard): "key:" and the first 16
// hex digits of the key's SHA-256; "" for no key.
func KeyTenant(key string) string {
	if key == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(key))
	return KeyTenantPrefix + hex.EncodeToString(sum[:8])
}
