package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/keyname"
	"github.com/llmlb/llmlb/internal/replicaurl"
)

// Validate reports every problem of the configuration at once
// (errors.Join), each naming its key: bad addresses and URLs, duplicate
// replica names, out-of-range values, and whatever the routing core's and
// the request parser's own Validate methods report.
func (c Config) Validate() error {
	v := &validator{}
	v.address("listen", c.Listen)
	v.address("admin_listen", c.AdminListen)
	if c.Listen != "" && c.Listen == c.AdminListen {
		v.add("admin_listen", "%q is also the proxy's listen address; use two addresses", c.AdminListen)
	}
	v.replicas(c.Replicas)
	v.tokenizers(c.Tokenizers)
	v.selfReplicas(c.Replicas, []string{c.Listen, c.AdminListen})
	v.section(c.Discovery.Validate())
	v.secret("admin_token", c.AdminToken)
	v.admin(c)

	s := c.Scrape
	v.positive("scrape.interval", s.Interval)
	v.positive("scrape.timeout", s.Timeout)
	if s.Timeout > 0 && s.Interval > 0 && s.Timeout > s.Interval {
		v.add("scrape.timeout", "%s is longer than scrape.interval (%s): a hung replica would be seen late", s.Timeout, s.Interval)
	}
	v.positiveInt("scrape.max_body_bytes", s.MaxBodyBytes)
	v.positive("scrape.models_interval", s.ModelsInterval)
	v.positiveInt("scrape.max_models", int64(s.MaxModels))
	v.positiveInt("scrape.max_model_name_bytes", int64(s.MaxModelNameBytes))
	v.oneOf("scrape.metrics", s.Metrics, MetricsModes...)

	v.section(c.Proxy.Validate())

	sv := c.Server
	v.positive("server.read_header_timeout", sv.ReadHeaderTimeout)
	v.positive("server.read_body_timeout", sv.ReadBodyTimeout)
	v.positive("server.idle_timeout", sv.IdleTimeout)
	v.positiveInt("server.max_connections", int64(sv.MaxConnections))
	if sv.ShutdownTimeout < 0 {
		v.add("server.shutdown_timeout", "must be >= 0, got %s", sv.ShutdownTimeout)
	}

	v.tls("server.tls", sv.TLS)
	v.tls("admin.tls", c.Admin.TLS)
	if sv.H2c && sv.TLS.Enabled() {
		v.add("server.h2c", "cleartext HTTP/2 needs a cleartext listener; with server.tls, HTTP/2 is negotiated by ALPN: drop server.h2c")
	}

	v.flowControl(c.FlowControl)
	v.positiveInt("epp.max_in_flight_per_replica", int64(c.EPP.MaxInFlightPerReplica))
	v.positiveInt("epp.max_exchanges_per_connection", int64(c.EPP.MaxExchangesPerConnection))
	v.tls("epp.tls", c.EPP.TLS)
	if f := c.EPP.ClientCAFile; f != "" {
		pem, err := os.ReadFile(f)
		switch {
		case !c.EPP.TLS.Enabled():
			v.add("epp.client_ca_file", "needs epp.tls.cert_file and epp.tls.key_file (mutual TLS is TLS first)")
		case err != nil:
			v.add("epp.client_ca_file", "cannot read %q: %v", f, err)
		case !x509.NewCertPool().AppendCertsFromPEM(pem):
			v.add("epp.client_ca_file", "%q holds no PEM certificate", f)
		}
	}

	v.oneOf("log.level", c.Log.Level, "debug", "info", "warn", "error")
	v.oneOf("log.format", c.Log.Format, "text", "json")

	// The routing core and the request parser validate their own sections;
	// called through an interface so this package builds before they have one.
	if rv, ok := any(c.Routing).(interface{ Validate() error }); ok {
		for _, err := range leaves(rv.Validate()) {
			v.errs = append(v.errs, fmt.Errorf("config: routing.%w", err))
		}
	}
	for _, err := range leaves(c.State.Validate()) {
		v.errs = append(v.errs, fmt.Errorf("config: %w", err))
	}
	if rv, ok := any(c.Request).(interface{ Validate() error }); ok {
		for _, err := range leaves(rv.Validate()) {
			v.errs = append(v.errs, fmt.Errorf("config: %w", err))
		}
	}
	return errors.Join(v.errs...)
}

// leaves flattens joined errors so each problem is reported on its own.
func leaves(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}

type validator struct {
	errs []error
}

func (v *validator) add(key, format string, args ...any) {
	v.errs = append(v.errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// section reports the problems a package found in the section it owns
// (discovery, proxy): each *keyname.Error as an *Error under its key, like
// the problems found here.
func (v *validator) section(err error) {
	for _, e := range leaves(err) {
		var ke *keyname.Error
		if errors.As(e, &ke) {
			v.add(ke.Key, "%s", ke.Msg)
		} else {
			v.errs = append(v.errs, fmt.Errorf("config: %w", e))
		}
	}
}

func (v *validator) positive(key string, d time.Duration) {
	if d <= 0 {
		v.add(key, "must be > 0, got %s", d)
	}
}

func (v *validator) positiveInt(key string, n int64) {
	if n <= 0 {
		v.add(key, "must be > 0, got %d", n)
	}
}

// oneOf checks that val is one of allowed, suggesting the likely intended
// one for a typo.
func (v *validator) oneOf(key, val string, allowed ...string) {
	for _, a := range allowed {
		if val == a {
			return
		}
	}
	hint := ""
	if s := keyname.Suggest(val, allowed); s != "" {
		hint = fmt.Sprintf(" (did you mean %q?)", s)
	}
	v.add(key, "%q is not one of %s%s", val, strings.Join(allowed, ", "), hint)
}

// address checks a listen address: host:port with a numeric port
// (":8080", "127.0.0.1:9090", "[::1]:8080").
func (v *validator) address(key, addr string) {
	if addr == "" {
		v.add(key, "empty address (write e.g. \":8080\")")
		return
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.add(key, "%q is not host:port (write e.g. \":8080\" or \"127.0.0.1:9090\")", addr)
		return
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		v.add(key, "%q: port %q is not a number in 0..65535", addr, port)
	}
}

// selfResolver resolves replica hosts for the self-loop check; tests
// replace it.
var selfResolver replicaurl.Resolver = replicaurl.LocalResolver{}

// selfReplicas refuses a replica URL that reaches one of llmlb's own
// listeners: every request sent there would come back (a loop).
func (v *validator) selfReplicas(rs []Replica, listeners []string) {
	for i, r := range rs {
		if len(replicaurl.Check(r.URL)) > 0 {
			continue
		}
		if l, self := replicaurl.PointsAt(r.URL, listeners, selfResolver); self {
			v.add(fmt.Sprintf("replicas[%d].url", i), "%q is llmlb's own listener %q: every request sent there would come back to llmlb", replicaurl.Redact(r.URL), l)
		}
	}
}

// replicas checks names (replicaurl.CheckName), URLs (replicaurl.Check), that
// no two replicas share a name or a URL, model lists and metrics modes.
func (v *validator) replicas(rs []Replica) {
	seen := make(map[string]int, len(rs))
	urls := make(map[string]int, len(rs))
	for i, r := range rs {
		key := fmt.Sprintf("replicas[%d]", i)
		switch {
		case r.Name == "" && r.URL != "" && defaultName(r.URL) == "":
			// the name would come from the URL, which is reported below
		default:
			if err := replicaurl.CheckName(r.Name); err != nil {
				v.add(key+".name", "%s", err)
			}
		}
		if first, dup := seen[r.Name]; dup && r.Name != "" {
			v.add(key+".name", "%q is also the name of replicas[%d]; names must be unique", r.Name, first)
		} else {
			seen[r.Name] = i
		}
		problems := replicaurl.Check(r.URL)
		for _, p := range problems {
			v.add(key+".url", "%s", p)
		}
		if len(problems) == 0 {
			if first, dup := urls[replicaurl.Key(r.URL)]; dup {
				v.add(key+".url", "%q is also the URL of replicas[%d] (%q); list each server once", r.URL, first, rs[first].Name)
			} else {
				urls[replicaurl.Key(r.URL)] = i
			}
		}
		v.secret(key+".api_key", r.APIKey)
		if r.KVCacheTokens < 0 {
			v.add(key+".kv_cache_tokens", "must be >= 0, got %d", r.KVCacheTokens)
		}
		if r.Metrics != "" { // "": scrape.metrics
			v.oneOf(key+".metrics", r.Metrics, MetricsModes...)
		}
		v.kvEvents(key, r)
		models := make(map[string]bool, len(r.Models))
		for j, m := range r.Models {
			mk := fmt.Sprintf("%s.models[%d]", key, j)
			if strings.TrimSpace(m) == "" {
				v.add(mk, "empty model name")
			} else if models[m] {
				v.add(mk, "%q is listed twice", m)
			}
			models[m] = true
		}
	}
}

// admin checks the admin section: host names without scheme, path or
// spaces, and the unauthenticated opt-in only on a loopback listener.
func (v *validator) admin(c Config) {
	if c.Admin.AllowUnauthenticatedMutations && c.AdminToken == "" && c.AdminListen != "" && !replicaurl.IsLoopback(c.AdminListen) {
		v.add("admin.allow_unauthenticated_mutations", "only allowed with admin_listen on a loopback address "+
			"(127.0.0.1, ::1, localhost), got %q: anyone on the network could add a replica and receive clients' keys; set admin_token", c.AdminListen)
	}
	for i, h := range c.Admin.AllowedHosts {
		key := fmt.Sprintf("admin.allowed_hosts[%d]", i)
		switch {
		case h == "":
			v.add(key, "empty host name")
		case strings.Contains(h, "://") || strings.ContainsAny(h, "/?#@ \"'") || len(h) > 255:
			v.add(key, "%q is not a host name (write e.g. llmlb.internal, without scheme or path)", h)
		case strings.IndexFunc(h, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0:
			v.add(key, "%q contains a control or non-ASCII character (write the punycode form)", h)
		}
	}
}

// tls checks that a certificate and its key are both named and load as a
// pair (the same check the listener makes when it starts or reloads).
func (v *validator) tls(prefix string, t TLS) {
	if !t.Enabled() {
		return
	}
	switch {
	case t.CertFile == "":
		v.add(prefix+".cert_file", "missing: %s.key_file is set, name the certificate too", prefix)
	case t.KeyFile == "":
		v.add(prefix+".key_file", "missing: %s.cert_file is set, name its private key too", prefix)
	default:
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			v.add(prefix+".cert_file", "cannot load the certificate with %s.key_file %q: %v", prefix, t.KeyFile, err)
		}
	}
}

// secret checks that a token can be sent in an Authorization header; the
// message never quotes the secret.
func (v *validator) secret(key, s string) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e {
			v.add(key, "contains a space, control or non-ASCII character at byte %d (a stray newline from the environment?)", i)
			return
		}
	}
}

// ValidateAfter is Validate for a configuration that Parse returned with
// decode errors: it joins those errors with Validate's, leaving out Validate's
// errors about keys the decoder already reported (a replica whose entry could
// not be read is not also reported as having no URL), so `llmlb validate`
// explains every problem once.
func (c Config) ValidateAfter(parseErr error) error {
	var bad []string
	for _, err := range leaves(parseErr) {
		var e *Error
		if errors.As(err, &e) && e.Key != "" {
			bad = append(bad, e.Key)
		}
	}
	errs := []error{parseErr}
	for _, err := range leaves(c.Validate()) {
		var e *Error
		if errors.As(err, &e) && slices.ContainsFunc(bad, func(k string) bool {
			return e.Key == k || strings.HasPrefix(e.Key, k+".") || strings.HasPrefix(e.Key, k+"[")
		}) {
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
