package request

import (
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/textproto"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// MaxKeyBytes bounds a session key or tenant id: a longer one is replaced by
// "sha256:" and 32 hex digits of its hash, so keys stay small in the pin
// table, logs and admin JSON.
const MaxKeyBytes = 256

// sessionKey returns the first session key found in the configured headers,
// then body fields, sanitized.
func sessionKey(cfg Config, header http.Header, fields map[string]json.RawMessage) string {
	for _, name := range cfg.SessionHeaders {
		for _, v := range header[canonicalHeader(name)] {
			if k := sanitizeKey(v); k != "" {
				return k
			}
		}
	}
	for _, path := range cfg.SessionBodyFields {
		raw := lookup(fields, path)
		if isNull(raw) {
			continue
		}
		v, ok := scalarText(raw)
		if !ok {
			continue
		}
		if path == "user_id" || strings.HasSuffix(path, ".user_id") {
			v = claudeCodeSession(v)
		}
		if k := sanitizeKey(v); k != "" {
			return k
		}
	}
	return ""
}

// lookup follows a dotted path through nested objects; nil when absent.
func lookup(fields map[string]json.RawMessage, path string) json.RawMessage {
	name, rest, nested := strings.Cut(path, ".")
	raw := fields[name]
	for nested && !isNull(raw) {
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return nil
		}
		name, rest, nested = strings.Cut(rest, ".")
		raw = obj[name]
	}
	return raw
}

// scalarText returns a JSON string's value or a number's literal.
func scalarText(raw json.RawMessage) (string, bool) {
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), true
	}
	return "", false
}

// claudeCodeSession extracts the session part of a Claude Code
// metadata.user_id: "session_<uuid>" from
// "user_<hash>_account_<id>_session_<uuid>", or the session_id of the JSON
// form newer versions send. Other user ids yield "": a user is not a session.
func claudeCodeSession(userID string) string {
	if i := strings.LastIndex(userID, "_session_"); i >= 0 {
		return userID[i+1:]
	}
	if strings.HasPrefix(strings.TrimSpace(userID), "{") {
		var v struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &v) == nil && v.SessionID != "" {
			return "session_" + v.SessionID
		}
	}
	return ""
}

// prefixKey is the MD5 (hex) of the first chars characters of text, preceded
// by "tenant:" when there is a tenant, so tenants sharing a system prompt
// get distinct keys.
func prefixKey(text string, chars int, tenant string) string {
	n := 0
	for i := range text {
		if n == chars {
			text = text[:i]
			break
		}
		n++
	}
	sum := md5OfString(text)
	if tenant == "" {
		return hex.EncodeToString(sum[:])
	}
	// "tenant:" and the hex digits in one allocation.
	var digits [2 * md5.Size]byte
	hex.Encode(digits[:], sum[:])
	return tenant + ":" + string(digits[:])
}

// md5OfString is md5.Sum of a string without copying it whole into a
// []byte first (a system prompt is up to prefix_chars characters, several
// KiB): longer texts go through the hash in pieces of a stack buffer.
func md5OfString(text string) [md5.Size]byte {
	var buf [512]byte
	if len(text) <= len(buf) {
		return md5.Sum(buf[:copy(buf[:], text)])
	}
	h := md5.New()
	for len(text) > 0 {
		n := copy(buf[:], text)
		h.Write(buf[:n])
		text = text[n:]
	}
	var sum [md5.Size]byte
	h.Sum(sum[:0])
	return sum
}

// sanitizeKey makes a client-supplied key safe for logs, headers and admin
// JSON: surrounding space trimmed, control, format and invalid bytes
// dropped, and keys longer than MaxKeyBytes replaced by a hash.
func sanitizeKey(s string) string {
	s = strings.TrimSpace(s)
	clean := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			clean = false
			break
		}
	}
	if !clean {
		var b strings.Builder
		for i := 0; i < len(s); {
			r, size := utf8.DecodeRuneInString(s[i:])
			if !(r == utf8.RuneError && size == 1) && unicode.IsPrint(r) {
				b.WriteRune(r)
			}
			i += size
		}
		s = strings.TrimSpace(b.String())
	}
	if len(s) > MaxKeyBytes {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:16])
	}
	return s
}

// canonicalNames caches the canonical form of configured header names:
// http.Header.Values canonicalizes its argument on every call, which for
// the nine lower-case defaults was nine allocations a request.
var canonicalNames sync.Map // name -> canonical name

func canonicalHeader(name string) string {
	if c, ok := canonicalNames.Load(name); ok {
		return c.(string)
	}
	c := textproto.CanonicalMIMEHeaderKey(name)
	canonicalNames.Store(name, c)
	return c
}
