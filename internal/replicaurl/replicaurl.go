// Package replicaurl holds the rules for the names and addresses llmlb is
// given: a replica's name and URL are checked the same way wherever the
// replica comes from (the configuration file, --replica, POST
// /admin/replicas, discovery), two URLs naming the same server are
// recognised, and a listen address binding only loopback is told apart.
package replicaurl

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// IsLoopback reports whether a listen address (host:port) binds only the
// loopback interface: "localhost", 127.0.0.0/8 or ::1. ":9090" and
// "0.0.0.0:9090" listen on every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// MaxNameLen bounds a replica name: it is a metrics label value, a
// response header (X-LLMLB-Replica) and a path segment of the admin API.
const MaxNameLen = 63

// CheckName reports why name cannot name a replica, or nil. Names are
// ASCII letters, digits and . _ : - (plus [ ] for a default name taken from
// an IPv6 URL), at most MaxNameLen bytes: no spaces, slashes, quotes,
// control characters or invalid UTF-8 (docs/SECURITY.md: a name with
// byte 0xff passed validation and panicked the metrics on the first scrape).
// The configuration and the admin API's POST /admin/replicas apply it alike.
func CheckName(name string) error {
	if name == "" {
		return errors.New("empty name")
	}
	for i := 0; i < len(name); i++ {
		if !nameByte(name[i]) {
			return fmt.Errorf("%q has a forbidden character at byte %d: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)", name, i)
		}
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%q is longer than %d characters", name, MaxNameLen)
	}
	return nil
}

func nameByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("._:-[]", c) >= 0
}

// Check returns every reason raw is not the root URL of an
// OpenAI-compatible server: it must be absolute http(s), without
// credentials (they would show in logs and /admin/replicas; use api_key),
// query, fragment or a /v1 suffix, with a valid port.
func Check(raw string) []string {
	if raw == "" {
		return []string{"empty URL (write e.g. http://10.0.0.5:8000)"}
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Opaque != "" {
		return []string{fmt.Sprintf("%q is not an absolute http(s) URL (write e.g. http://10.0.0.5:8000)", Redact(raw))}
	}
	var out []string
	if u.User != nil {
		out = append(out, fmt.Sprintf("%q holds credentials; put the key in api_key_env instead", u.Redacted()))
	}
	if u.RawQuery != "" || u.Fragment != "" || u.ForceQuery {
		out = append(out, fmt.Sprintf("%q has a query or fragment; give the server's root URL", u.Redacted()))
	}
	if p := strings.TrimRight(u.Path, "/"); strings.HasSuffix(p, "/v1") {
		out = append(out, fmt.Sprintf("%q ends in /v1; give the server's root (llmlb adds /v1/... and /metrics itself)", u.Redacted()))
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			out = append(out, fmt.Sprintf("%q: port %q is not a number in 1..65535", u.Redacted(), port))
		}
	} else if _, _, err := net.SplitHostPort(u.Host); err == nil {
		out = append(out, fmt.Sprintf("%q: empty port", u.Redacted()))
	}
	return out
}

// Redact hides the password of a URL that url.Parse rejects as a whole, so
// an error message can quote it (url.URL.Redacted needs a parsed URL).
func Redact(raw string) string {
	if at := strings.LastIndexByte(raw, '@'); at >= 0 {
		if scheme := strings.Index(raw, "://"); scheme >= 0 && scheme < at {
			return raw[:scheme+3] + "xxxxx" + raw[at:]
		}
	}
	return raw
}

// Key returns the identity of a replica URL for duplicate detection:
// scheme, lower-case host, explicit port (80/443 by default) and the path
// without trailing slashes. Two replicas with the same key would be one
// server counted twice (its load split, its health judged twice).
func Key(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return raw
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	host := strings.ToLower(strings.TrimSuffix(u.Hostname(), "."))
	return strings.ToLower(u.Scheme) + "://" + net.JoinHostPort(host, port) + strings.TrimRight(u.Path, "/")
}
