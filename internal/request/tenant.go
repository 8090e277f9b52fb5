package request

import "net/http"

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
