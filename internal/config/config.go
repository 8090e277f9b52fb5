// Package config is llmlb's YAML configuration: plain data with the
// defaults of docs/CONFIG.md, strict parsing (an unknown key is an error naming the key
// and its line) and a Validate that explains every error. A section that
// belongs to one subsystem (routing, request, discovery, proxy, state) is
// that package's Config type, with its defaults and validation; this
// package assembles the sections, reads and writes the file and reports
// the errors, and the packages below the server do not import it.
package config

import (
	"log/slog"
	"net/url"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/modeltok"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/replicaurl"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/scrape"
	"github.com/llmlb/llmlb/internal/sharedstate"
)

// Config is the whole configuration of `llmlb serve`.
type Config struct {
	Listen      string // listen (":8080")
	AdminListen string // admin_listen ("127.0.0.1:9090")
	AdminToken  string // admin_token: bearer token for admin mutations and /admin/pins ("" = none); admin_token_env names an env var
	Admin       Admin  // admin: allowed_hosts, allow_unauthenticated_mutations

	Replicas  []Replica        // replicas
	Discovery discovery.Config // discovery: where else replicas come from (static, kubernetes, dns, gpustack)

	Routing balancer.Config // routing: policy, load, affinity, health, probing, alerts
	Request request.Config  // request: session_headers, session_body_fields, tenant_headers, prefix_chars, default_output_tokens

	// Tokenizers are models' own tokenizers (tokenizers[].models,
	// tokenizers[].path): with them llmlb tokenizes those models' prompts
	// as their engines do, and keys replicas' KV cache events by token ids
	// (docs/KV_EVENTS.md). Read at start.
	Tokenizers []modeltok.Config
	Scrape     Scrape       // scrape
	Proxy      proxy.Config // proxy
	Server     Server       // server
	Log        Log          // log

	// FlowControl holds requests inside llmlb while every replica of their
	// model is full and dispatches them late, by priority and fairly between
	// tenants (flow_control; docs/FLOW_CONTROL.md). On by default.
	FlowControl FlowControl

	// State shares pins and the KV block index with other llmlb instances
	// through Redis (state.redis_url; docs/SHARED_STATE.md). Off by default.
	State sharedstate.Config

	// EPP bounds `llmlb epp`'s picks (epp; docs/EPP.md). serve ignores it.
	EPP EPP
}

// EPP configures what `llmlb epp` alone uses.
type EPP struct {
	// MaxInFlightPerReplica bounds the requests the picker routed to one
	// replica and has not seen end (epp.max_in_flight_per_replica, 1024):
	// a replica at the bound is not picked; a request no other replica may
	// take is refused 429 with Retry-After.
	MaxInFlightPerReplica int
	// MaxExchangesPerConnection bounds the exchanges (HTTP requests) one
	// gateway connection may hold open at once
	// (epp.max_exchanges_per_connection, 256): the gRPC port's HTTP/2
	// SETTINGS_MAX_CONCURRENT_STREAMS. Envoy opens another connection when
	// one is full; a client that ignores the bound has the stream refused.
	MaxExchangesPerConnection int
	// TLS makes the gRPC port speak TLS (epp.tls.cert_file,
	// epp.tls.key_file; off when empty). Read at start.
	TLS TLS
	// ClientCAFile makes it mutual TLS: clients must present a certificate
	// chaining to one of this PEM file's (epp.client_ca_file; needs epp.tls).
	ClientCAFile string
}

// Admin decides who may use the admin listener besides the token holder
// (docs/SECURITY.md).
type Admin struct {
	// AllowedHosts are extra Host header names the admin listener answers
	// (admin.allowed_hosts). IP literals, "localhost" and admin_listen's own
	// host are always allowed; any other name is refused, which defeats DNS
	// rebinding. "*" allows every name.
	AllowedHosts []string
	// TLS makes the admin listener speak HTTPS (admin.tls.cert_file,
	// admin.tls.key_file; off when empty).
	TLS TLS
	// AllowUnauthenticatedMutations opens add/remove/drain without
	// admin_token (admin.allow_unauthenticated_mutations, false). Only
	// allowed with admin_listen on a loopback address.
	AllowUnauthenticatedMutations bool
}

// Replica is one configured upstream.
type Replica struct {
	Name   string   // name (default: host:port of the URL)
	URL    string   // url
	Models []string // models (optional; learned from /v1/models when empty)
	APIKey string   // api_key, or api_key_env naming an environment variable; replaces the client's Authorization
	// Metrics is how the replica is scraped, MetricsAuto or MetricsNone
	// (metrics; "": scrape.metrics).
	Metrics string
	// KVCacheTokens declares the replica's KV capacity in tokens
	// (kv_cache_tokens; 0: as the replica reports it, within plausibility
	// bounds).
	KVCacheTokens int
	// KVEvents is the replica's KV cache event publisher (vLLM's
	// --kv-events-config endpoint), tcp://host:port; "" for none.
	// KVEventsReplay is its replay socket, "" for none.
	KVEvents, KVEventsReplay string
}

// The values of scrape.metrics and replicas[].metrics.
const (
	// MetricsAuto scrapes /metrics and reads the load of whichever engine
	// exports it: vLLM, SGLang, TGI or llama.cpp.
	MetricsAuto = "auto"
	// MetricsNone is for a replica without a Prometheus endpoint (Ollama,
	// LM Studio, most OpenAI-compatible shims): its scrape is GET /v1/models,
	// where a 200 keeps it LIVE, and its load is only llmlb's own requests.
	MetricsNone = "none"
)

// MetricsModes are the accepted values of scrape.metrics and replicas[].metrics.
var MetricsModes = []string{MetricsAuto, MetricsNone}

// Scrape configures the metrics scraper.
type Scrape struct {
	Interval       time.Duration // scrape.interval (3s)
	Timeout        time.Duration // scrape.timeout (1s)
	MaxBodyBytes   int64         // scrape.max_body_bytes (4 MiB)
	HealthCheck    bool          // scrape.health_check: also GET /health (false)
	ModelsInterval time.Duration // scrape.models_interval: refresh /v1/models (30s)
	// MaxModels and MaxModelNameBytes bound what one replica's /v1/models
	// may teach (scrape.max_models 1000, scrape.max_model_name_bytes 512).
	MaxModels         int
	MaxModelNameBytes int
	// Metrics is how replicas without their own metrics setting are
	// scraped, those added through the admin API or discovery included
	// (scrape.metrics, MetricsAuto).
	Metrics string
}

// Server configures the listeners' lifecycle.
type Server struct {
	ReadHeaderTimeout time.Duration // server.read_header_timeout (10s)
	ReadBodyTimeout   time.Duration // server.read_body_timeout: time a client has to send the request body (60s)
	IdleTimeout       time.Duration // server.idle_timeout (120s)
	MaxConnections    int           // server.max_connections: open client connections on the proxy listener; more wait in the kernel's backlog (10000)
	ShutdownTimeout   time.Duration // server.shutdown_timeout: drain deadline on SIGTERM (60s)
	// TLS makes the proxy listener speak HTTPS, HTTP/2 included through
	// ALPN (server.tls.cert_file, server.tls.key_file; off when empty).
	TLS TLS
	// H2c also serves HTTP/2 without TLS to clients that open with its
	// preface ("prior knowledge", server.h2c, false).
	H2c bool
}

// TLS names a certificate and its key, PEM files re-read on SIGHUP and
// when their content changes.
type TLS struct {
	CertFile string // cert_file: the certificate chain, leaf first
	KeyFile  string // key_file: the private key of the leaf
}

// Enabled reports whether a certificate is configured.
func (t TLS) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// Log configures logging.
type Log struct {
	Level  string // log.level: debug|info|warn|error (info)
	Format string // log.format: text|json (text)
	Access bool   // log.access: one info line per proxied request (true)
}

// Default returns the configuration with every routing default (docs/ROUTING.md) and the
// field comments above: listen ":8080", admin "127.0.0.1:9090", no replicas.
func Default() Config {
	routing := balancer.DefaultConfig() // policy cost (policy.DefaultName)
	return Config{
		Listen:      ":8080",
		AdminListen: "127.0.0.1:9090",
		Admin:       Admin{AllowedHosts: []string{}},
		Discovery:   discovery.DefaultConfig(),
		Routing:     routing,
		Request:     request.DefaultConfig(),
		Scrape: Scrape{
			Interval:          3 * time.Second,
			Timeout:           time.Second,
			MaxBodyBytes:      4 << 20,
			HealthCheck:       false,
			ModelsInterval:    30 * time.Second,
			MaxModels:         scrape.DefaultMaxModels,
			MaxModelNameBytes: scrape.DefaultMaxModelNameBytes,
			Metrics:           MetricsAuto,
		},
		Proxy: proxy.DefaultConfig(),
		Server: Server{
			ReadHeaderTimeout: 10 * time.Second,
			ReadBodyTimeout:   60 * time.Second,
			IdleTimeout:       120 * time.Second,
			MaxConnections:    10000,
			ShutdownTimeout:   60 * time.Second,
		},
		Log:         Log{Level: "info", Format: "text", Access: true},
		FlowControl: DefaultFlowControl(),
		State:       sharedstate.DefaultConfig(),
		EPP:         EPP{MaxInFlightPerReplica: 1024, MaxExchangesPerConnection: 256},
	}
}

// redacted replaces a secret in printed configurations.
const redacted = "<redacted>"

// Redacted returns a deep copy safe to print or log: the admin token,
// every replica's api_key and the api_key of flow control's priority rules
// are replaced by "<redacted>" when set.
func (c Config) Redacted() Config {
	c.Replicas = slices.Clone(c.Replicas)
	for i := range c.Replicas {
		c.Replicas[i] = c.Replicas[i].Redacted()
	}
	if c.AdminToken != "" {
		c.AdminToken = redacted
	}
	c.Discovery = c.Discovery.Redacted()
	c.State.RedisURL = redactPassword(c.State.RedisURL)
	c.FlowControl.PriorityRules = slices.Clone(c.FlowControl.PriorityRules)
	for i := range c.FlowControl.PriorityRules {
		if c.FlowControl.PriorityRules[i].APIKey != "" {
			c.FlowControl.PriorityRules[i].APIKey = redacted
		}
	}
	c.FlowControl.Tenants = slices.Clone(c.FlowControl.Tenants)
	return c
}

// redactPassword hides the password of a URL's user information.
func redactPassword(raw string) string {
	if raw == "" {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return replicaurl.Redact(raw)
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), redacted)
		return u.String()
	}
	return raw
}

// Redacted returns a copy of r with its api_key replaced by "<redacted>".
func (r Replica) Redacted() Replica {
	r.Models = slices.Clone(r.Models)
	if r.APIKey != "" {
		r.APIKey = redacted
	}
	return r
}

// LogValue makes slog print the redacted configuration, so a stray
// slog.Any("config", cfg) never leaks a secret.
func (c Config) LogValue() slog.Value {
	type plain Config // no methods: stops slog from calling LogValue again
	return slog.AnyValue(plain(c.Redacted()))
}

// LogValue makes slog print the replica without its api_key.
func (r Replica) LogValue() slog.Value {
	type plain Replica
	return slog.AnyValue(plain(r.Redacted()))
}
