// Package keyname derives configuration key names from Go field names, so
// the YAML keys (package config) and policy parameters (package policy) are
// spelled the same way. It also gives the packages that own a section of
// the configuration what they share with package config when they validate
// it: problems named by their key (Error) and typo suggestions (Suggest).
package keyname

import (
	"strings"
	"unicode"
)

// Snake turns a Go field name into its key: SessionTTL -> session_ttl,
// APIKey -> api_key, KVCacheTokens -> kv_cache_tokens.
func Snake(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 {
			prevLower := unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1])
			nextLower := i+1 < len(r) && unicode.IsLower(r[i+1])
			if prevLower || (unicode.IsUpper(r[i-1]) && nextLower) {
				b.WriteByte('_')
			}
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}
