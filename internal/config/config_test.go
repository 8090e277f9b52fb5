package config

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/modeltok"

	"github.com/google/go-cmp/cmp"
)

// env is the environment the parse tests see.
func env(name string) (string, bool) {
	v, ok := map[string]string{"VLLM_KEY": "sk-vllm", "ADMIN_TOKEN": "tok-admin", "EMPTY": ""}[name]
	return v, ok
}

// messages splits a joined error into its lines.
func messages(err error) []string {
	if err == nil {
		return nil
	}
	return strings.Split(err.Error(), "\n")
}

func TestDefault(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatalf("Default().Validate() = %v", err)
	}
	checks := []struct {
		key       string
		got, want any
	}{
		{"listen", c.Listen, ":8080"},
		{"admin_listen", c.AdminListen, "127.0.0.1:9090"},
		{"scrape.interval", c.Scrape.Interval, 3 * time.Second},
		{"scrape.timeout", c.Scrape.Timeout, time.Second},
		{"scrape.max_body_bytes", c.Scrape.MaxBodyBytes, int64(4 << 20)},
		{"scrape.models_interval", c.Scrape.ModelsInterval, 30 * time.Second},
		{"scrape.max_models", c.Scrape.MaxModels, 1000},
		{"scrape.max_model_name_bytes", c.Scrape.MaxModelNameBytes, 512},
		{"scrape.metrics", c.Scrape.Metrics, "auto"},
		{"proxy.max_body_bytes", c.Proxy.MaxBodyBytes, int64(32 << 20)},
		{"proxy.max_attempts", c.Proxy.MaxAttempts, 3},
		{"proxy.route_headers", c.Proxy.RouteHeaders, true},
		{"proxy.first_byte_timeout", c.Proxy.FirstByteTimeout, 10 * time.Minute},
		{"proxy.pass_authorization", c.Proxy.PassAuthorization, true},
		{"server.shutdown_timeout", c.Server.ShutdownTimeout, 60 * time.Second},
		{"log.level", c.Log.Level, "info"},
		{"routing.affinity.session_ttl", c.Routing.Affinity.SessionTTL, 60 * time.Minute},
		{"routing.affinity.prefix_ttl", c.Routing.Affinity.PrefixTTL, 5 * time.Minute},
		{"routing.health.probing_window", c.Routing.Health.ProbingWindow, 15 * time.Second},
		{"request.prefix_chars", c.Request.PrefixChars, 4096},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.key, ch.got, ch.want)
		}
	}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want func(*Config) // applied to Default() to get the expected config
	}{
		{name: "empty file", yaml: "", want: func(*Config) {}},
		{name: "only comments", yaml: "# nothing yet\n", want: func(*Config) {}},
		{name: "empty sections keep defaults", yaml: "routing:\nscrape:\n", want: func(*Config) {}},
		{name: "top-level keys", yaml: "listen: \":9000\"\nadmin_listen: 127.0.0.1:9999\nadmin_token: abc\n",
			want: func(c *Config) { c.Listen, c.AdminListen, c.AdminToken = ":9000", "127.0.0.1:9999", "abc" }},
		{name: "replicas with defaults for name", yaml: `
replicas:
  - name: gpu-a
    url: http://10.0.0.1:8000
    models: [qwen, qwen-lora]
  - url: http://10.0.0.2:8000
  - http://10.0.0.3:8000
  - gpu-d=http://10.0.0.4:8000
`, want: func(c *Config) {
			c.Replicas = []Replica{
				{Name: "gpu-a", URL: "http://10.0.0.1:8000", Models: []string{"qwen", "qwen-lora"}},
				{Name: "10.0.0.2:8000", URL: "http://10.0.0.2:8000"},
				{Name: "10.0.0.3:8000", URL: "http://10.0.0.3:8000"},
				{Name: "gpu-d", URL: "http://10.0.0.4:8000"},
			}
		}},
		{name: "secrets from the environment", yaml: `
admin_token_env: ADMIN_TOKEN
replicas:
  - {name: a, url: "http://a:8000", api_key_env: VLLM_KEY}
  - {name: b, url: "http://b:8000", api_key: inline}
`, want: func(c *Config) {
			c.AdminToken = "tok-admin"
			c.Replicas = []Replica{{Name: "a", URL: "http://a:8000", APIKey: "sk-vllm"}, {Name: "b", URL: "http://b:8000", APIKey: "inline"}}
		}},
		{name: "routing durations and numbers", yaml: `
request: {prompt_blocks: true}
routing:
  policy: prefix-tree
  load: {token_unit: 2000, min_weight: 0.5}
  affinity:
    session_ttl: 90m
    prefix_ttl: 1h30m
    session_slack: 2
    max_pins: 1_000
  health:
    probing_window: 20s
    max_cooldown: 10m
  probing: {max_in_flight: 4}
  alerts: {imbalance_index: 2.5, probe_broken_for: 2m}
`, want: func(c *Config) {
			c.Routing.Policy = "prefix-tree"
			c.Request.PromptBlocks = true
			c.Routing.Load.TokenUnit, c.Routing.Load.MinWeight = 2000, 0.5
			c.Routing.Affinity.SessionTTL = 90 * time.Minute
			c.Routing.Affinity.PrefixTTL = 90 * time.Minute
			c.Routing.Affinity.SessionSlack = 2
			c.Routing.Affinity.MaxPins = 1000
			c.Routing.Health.ProbingWindow = 20 * time.Second
			c.Routing.Health.MaxCooldown = 10 * time.Minute
			c.Routing.Probing.MaxInFlight = 4
			c.Routing.Alerts.ImbalanceIndex = 2.5
			c.Routing.Alerts.ProbeBrokenFor = 2 * time.Minute
		}},
		{name: "lists replace defaults", yaml: "request:\n  session_headers: [x-my-session]\n  tenant_headers: []\n",
			want: func(c *Config) {
				c.Request.SessionHeaders = []string{"x-my-session"}
				c.Request.TenantHeaders = []string{}
			}},
		{name: "retry statuses", yaml: "proxy: {retry_statuses: [429, 500]}\n",
			want: func(c *Config) { c.Proxy.RetryStatuses = []int{429, 500} }},
		{name: "no retry statuses", yaml: "proxy: {retry_statuses: []}\n",
			want: func(c *Config) { c.Proxy.RetryStatuses = []int{} }},
		{name: "sizes and booleans", yaml: `
scrape: {max_body_bytes: 8MiB, health_check: true, timeout: 500ms}
proxy: {max_body_bytes: 1048576, route_headers: false, max_attempts: 1}
`, want: func(c *Config) {
			c.Scrape.MaxBodyBytes, c.Scrape.HealthCheck, c.Scrape.Timeout = 8<<20, true, 500*time.Millisecond
			c.Proxy.MaxBodyBytes, c.Proxy.RouteHeaders, c.Proxy.MaxAttempts = 1<<20, false, 1
		}},
		{name: "x- extension keys hold anchors", yaml: `
x-auth: &auth {api_key_env: VLLM_KEY}
replicas:
  - {<<: *auth, url: "http://a:8000"}
`, want: func(c *Config) {
			c.Replicas = []Replica{{Name: "a:8000", URL: "http://a:8000", APIKey: "sk-vllm"}}
		}},
		{name: "merge into replicas", yaml: `
replicas:
  - &a {name: a, url: "http://a:8000", api_key_env: VLLM_KEY, models: [qwen]}
  - <<: *a
    name: b
    url: http://b:8000
`, want: func(c *Config) {
			c.Replicas = []Replica{
				{Name: "a", URL: "http://a:8000", APIKey: "sk-vllm", Models: []string{"qwen"}},
				{Name: "b", URL: "http://b:8000", APIKey: "sk-vllm", Models: []string{"qwen"}},
			}
		}},
		{name: "metrics modes", yaml: `
scrape: {metrics: none}
replicas:
  - {name: sglang, url: "http://a:30000", metrics: auto}
  - {name: ollama, url: "http://b:11434", metrics: none}
  - {name: default, url: "http://c:8000"}
`, want: func(c *Config) {
			c.Scrape.Metrics = "none"
			c.Replicas = []Replica{
				{Name: "sglang", URL: "http://a:30000", Metrics: "auto"},
				{Name: "ollama", URL: "http://b:11434", Metrics: "none"},
				{Name: "default", URL: "http://c:8000"},
			}
		}},
		{name: "log", yaml: "log: {level: debug, format: json}\n",
			want: func(c *Config) { c.Log = Log{Level: "debug", Format: "json", Access: true} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parse([]byte(tt.yaml), "test.yaml", env)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := Default()
			tt.want(&want)
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("config mismatch (-want +got):\n%s", d)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // every message, in order
	}{
		{name: "unknown key with a close sibling", yaml: "routing:\n  afinity:\n    session_ttl: 5m\n",
			want: []string{`config: test.yaml: line 2: routing.afinity: unknown key (did you mean "affinity"?)`}},
		{name: "unknown key found elsewhere", yaml: "session_ttl: 5m\n",
			want: []string{`config: test.yaml: line 1: session_ttl: unknown key (did you mean "routing.affinity.session_ttl"?)`}},
		{name: "unknown top-level key lists the known ones", yaml: "\n\nfrobnicate: 1\n",
			want: []string{`config: test.yaml: line 3: frobnicate: unknown key (known keys: listen, admin_listen, admin_token, admin, replicas, discovery, routing, request, tokenizers, scrape, proxy, server, log, flow_control, state, epp, admin_token_env)`}},
		{name: "x- keys only at the top", yaml: "routing:\n  x-note: 1\n",
			want: []string{`config: test.yaml: line 2: routing.x-note: unknown key`}},
		{name: "unknown replica key", yaml: "replicas:\n  - url: http://a:8000\n    apikey: x\n",
			want: []string{`config: test.yaml: line 3: replicas[0].apikey: unknown key (did you mean "api_key"?)`}},
		{name: "bad duration", yaml: "scrape:\n  interval: 3 sec\n",
			want: []string{`config: test.yaml: line 2: scrape.interval: "3 sec" is not a duration (write e.g. "500ms", "90s", "5m", "1h")`}},
		{name: "duration without unit", yaml: "routing:\n  health:\n    probing_window: 15\n",
			want: []string{`config: test.yaml: line 3: routing.health.probing_window: 15 has no unit: write a duration such as "15s" or "15ms"`}},
		{name: "wrong types, all reported", yaml: `
proxy:
  max_attempts: three
  route_headers: yes
  max_body_bytes: lots
routing:
  load:
    min_weight: heavy
  affinity: 5
replicas: http://a:8000
`, want: []string{
			`config: test.yaml: line 3: proxy.max_attempts: expected an integer, got "three"`,
			`config: test.yaml: line 4: proxy.route_headers: expected true or false, got "yes"`,
			`config: test.yaml: line 5: proxy.max_body_bytes: "lots" is not a byte size (write e.g. 4194304 or "4MiB"; units B, GB, GiB, KB, KiB, MB, MiB)`,
			`config: test.yaml: line 8: routing.load.min_weight: expected a number, got "heavy"`,
			`config: test.yaml: line 9: routing.affinity: expected a mapping of keys, got 5`,
			`config: test.yaml: line 10: replicas: expected a list, got "http://a:8000"`,
		}},
		{name: "retry status not a number", yaml: "proxy: {retry_statuses: [429, busy]}\n",
			want: []string{`config: test.yaml: line 1: proxy.retry_statuses[1]: expected an integer, got "busy"`}},
		{name: "float for an int", yaml: "proxy: {max_attempts: 2.5}\n",
			want: []string{`config: test.yaml: line 1: proxy.max_attempts: expected an integer, got 2.5`}},
		{name: "quoted number for an int", yaml: "proxy: {max_attempts: \"2\"}\n",
			want: []string{`config: test.yaml: line 1: proxy.max_attempts: expected an integer, got "2"`}},
		{name: "out of range", yaml: "routing: {seed: -1}\nproxy: {max_attempts: 99999999999999999999}\n",
			want: []string{
				`config: test.yaml: line 1: routing.seed: expected a non-negative integer, got -1`,
				`config: test.yaml: line 2: proxy.max_attempts: expected an integer, got 99999999999999999999`,
			}},
		{name: "list where a value belongs", yaml: "listen: [a, b]\n",
			want: []string{`config: test.yaml: line 1: listen: expected a single value, got a list`}},
		{name: "missing value", yaml: "listen:\n",
			want: []string{`config: test.yaml: line 1: listen: no value given`}},
		{name: "repeated key", yaml: "listen: \":1\"\nlisten: \":2\"\n",
			want: []string{`config: test.yaml: line 2: listen: repeated key (first at line 1)`}},
		{name: "unset environment variable", yaml: "admin_token_env: NOPE\nreplicas:\n  - {url: \"http://a:8000\", api_key_env: EMPTY}\n",
			want: []string{
				`config: test.yaml: line 1: admin_token_env: environment variable NOPE is not set`,
				`config: test.yaml: line 3: replicas[0].api_key_env: environment variable EMPTY is empty`,
			}},
		{name: "secret and its env key both", yaml: "replicas:\n  - {url: \"http://a:8000\", api_key: x, api_key_env: VLLM_KEY}\n",
			want: []string{`config: test.yaml: line 2: replicas[0].api_key_env: set either api_key or api_key_env, not both`}},
		{name: "bad replica shorthand", yaml: "replicas:\n  - =http://a:8000\n  - localhost:8000\n  -\n",
			want: []string{
				`config: test.yaml: line 2: replicas[0]: empty name before '='; write name=URL or URL`,
				`config: test.yaml: line 3: replicas[1]: "localhost:8000" is not an absolute http(s) URL (e.g. http://10.0.0.5:8000)`,
				`config: test.yaml: line 4: replicas[2]: empty list item`,
			}},
		{name: "not a mapping", yaml: "- a\n- b\n",
			want: []string{`config: test.yaml: line 1: expected a mapping of keys, got a list`}},
		{name: "syntax error", yaml: "listen: \":8080\"\n  admin_listen: x\n",
			want: []string{`config: test.yaml: line 1: invalid YAML: did not find expected key`}},
		{name: "two documents", yaml: "listen: \":1\"\n---\nlisten: \":2\"\n",
			want: []string{`config: test.yaml: line 2: more than one YAML document (---); a configuration is one document`}},
		{name: "self-merge", yaml: "routing: &r\n  <<: *r\n",
			want: []string{`config: test.yaml: line 2: routing: nested too deeply, or aliases (*name) refer to themselves or expand too much`}},
		{name: "nan", yaml: "routing: {alerts: {imbalance_index: .nan}}\n",
			want: []string{`config: test.yaml: line 1: routing.alerts.imbalance_index: expected a finite number, got .nan`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.yaml), "test.yaml", env)
			if d := cmp.Diff(tt.want, messages(err)); d != "" {
				t.Errorf("errors mismatch (-want +got):\n%s", d)
			}
			var ce *Error
			if err != nil && !errors.As(err, &ce) {
				t.Errorf("error %v is not a *config.Error", err)
			}
		})
	}
}

// Aliases turn YAML into a graph: a file whose merges expand a million-fold
// or whose errors repeat endlessly is cut short, not walked.
func TestParseAliasBombs(t *testing.T) {
	var bomb strings.Builder
	bomb.WriteString("x0: &x0 {policy: rr}\n")
	for i := 1; i <= 6; i++ {
		fmt.Fprintf(&bomb, "x%d: &x%d {<<: [%s]}\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*x%d,", i-1), 10), ","))
	}
	bomb.WriteString("routing: *x6\n")
	errorsBomb := "request: {session_headers: [" + strings.TrimSuffix(strings.Repeat("[a],", 1000), ",") + "]}\n"
	tests := []struct {
		name, yaml, want string
		maxErrors        int
	}{
		{"merge bomb", bomb.String(), "aliases (*name) refer to themselves or expand too much", 8},
		{"error flood", errorsBomb, "config: test.yaml: too many errors; fix these first", 101},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse([]byte(tt.yaml), "test.yaml", env)
			msgs := messages(err)
			if err == nil || !strings.Contains(err.Error(), tt.want) || len(msgs) > tt.maxErrors {
				t.Errorf("got %d errors, want at most %d including %q; first: %.300v", len(msgs), tt.maxErrors, tt.want, err)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/llmlb.yaml"
	if err := os.WriteFile(path, []byte("routing:\n  policy: rr\n  nope: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	want := "config: " + path + ": line 3: routing.nope: unknown key"
	if err == nil || err.Error() != want {
		t.Errorf("Load = %v, want %q", err, want)
	}
	if _, err := Load(dir + "/missing.yaml"); err == nil || !strings.HasPrefix(err.Error(), "config: open ") {
		t.Errorf("Load(missing) = %v, want a config: open error", err)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   []string
	}{
		{name: "defaults are valid", modify: func(*Config) {}},
		{name: "bad replica URLs", modify: func(c *Config) {
			c.Replicas = []Replica{
				{Name: "a", URL: "http://10.0.0.1:8000"},
				{Name: "b", URL: "localhost:8000"},
				{Name: "c", URL: "ftp://host/"},
				{Name: "d", URL: "http://host:8000/v1"},
				{Name: "e", URL: "http://user:pw@host:8000"},
				{Name: "f", URL: ""},
				{Name: "g", URL: "http://host:8000/?x=1"},
				{Name: "h", URL: "http://host:99999"},
			}
		}, want: []string{
			`config: replicas[1].url: "localhost:8000" is not an absolute http(s) URL (write e.g. http://10.0.0.5:8000)`,
			`config: replicas[2].url: "ftp://host/" is not an absolute http(s) URL (write e.g. http://10.0.0.5:8000)`,
			`config: replicas[3].url: "http://host:8000/v1" ends in /v1; give the server's root (llmlb adds /v1/... and /metrics itself)`,
			`config: replicas[4].url: "http://user:xxxxx@host:8000" holds credentials; put the key in api_key_env instead`,
			`config: replicas[5].url: empty URL (write e.g. http://10.0.0.5:8000)`,
			`config: replicas[6].url: "http://host:8000/?x=1" has a query or fragment; give the server's root URL`,
			`config: replicas[7].url: "http://host:99999": port "99999" is not a number in 1..65535`,
		}},
		{name: "replica names", modify: func(c *Config) {
			c.Replicas = []Replica{
				{Name: "a", URL: "http://h1:8000"},
				{Name: "a", URL: "http://h2:8000"},
				{Name: "", URL: "http://h3:8000"},
				{Name: "b c", URL: "http://h4:8000", Models: []string{"m", "", "m"}},
				{Name: "d", URL: "http://h5:8000", APIKey: "sk-abc\n"},
			}
		}, want: []string{
			`config: replicas[1].name: "a" is also the name of replicas[0]; names must be unique`,
			`config: replicas[2].name: empty name`,
			`config: replicas[3].name: "b c" has a forbidden character at byte 1: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[3].models[1]: empty model name`,
			`config: replicas[3].models[2]: "m" is listed twice`,
			`config: replicas[4].api_key: contains a space, control or non-ASCII character at byte 6 (a stray newline from the environment?)`,
		}},
		// docs/SECURITY.md [11]: `--replica $'gpu\xff=http://...'` passed validation and
		// panicked the metrics on the first scrape.
		{name: "replica names: strict charset and length", modify: func(c *Config) {
			c.Replicas = []Replica{
				{Name: "gpu\xff", URL: "http://h1:8000"},
				{Name: "gpu\x00", URL: "http://h2:8000"},
				{Name: "gpu\"1", URL: "http://h3:8000"},
				{Name: "gpu\n1", URL: "http://h4:8000"},
				{Name: "gpu/1", URL: "http://h5:8000"},
				{Name: "gpü", URL: "http://h6:8000"},
				{Name: strings.Repeat("g", 64), URL: "http://h7:8000"},
				{Name: strings.Repeat("g", 63), URL: "http://h8:8000"},
				{Name: "gpu-1.rack_2:a", URL: "http://h9:8000"},
				{Name: "[::1]:8000", URL: "http://[::1]:8000"},
			}
		}, want: []string{
			`config: replicas[0].name: "gpu\xff" has a forbidden character at byte 3: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[1].name: "gpu\x00" has a forbidden character at byte 3: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[2].name: "gpu\"1" has a forbidden character at byte 3: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[3].name: "gpu\n1" has a forbidden character at byte 3: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[4].name: "gpu/1" has a forbidden character at byte 3: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[5].name: "gpü" has a forbidden character at byte 2: names are letters, digits and . _ : - (it appears in headers, metrics and admin URLs)`,
			`config: replicas[6].name: "` + strings.Repeat("g", 64) + `" is longer than 63 characters`,
		}},
		{name: "the same URL under two names", modify: func(c *Config) {
			c.Replicas = []Replica{
				{Name: "a", URL: "http://gpu1:8000"},
				{Name: "b", URL: "http://GPU1:8000/"},
				{Name: "c", URL: "http://gpu2"},
				{Name: "d", URL: "http://gpu2:80"},
				{Name: "e", URL: "https://gpu2"},
				{Name: "f", URL: "http://gpu1:8001"},
			}
		}, want: []string{
			`config: replicas[1].url: "http://GPU1:8000/" is also the URL of replicas[0] ("a"); list each server once`,
			`config: replicas[3].url: "http://gpu2:80" is also the URL of replicas[2] ("c"); list each server once`,
		}},
		{name: "URL credentials never quoted", modify: func(c *Config) {
			c.Replicas = []Replica{{Name: "a", URL: "http://u:hunter2@h:8000/?q#f"}, {Name: "b", URL: "http://u:hunter2@h:8000/x y%zz"}}
		}, want: []string{
			`config: replicas[0].url: "http://u:xxxxx@h:8000/?q#f" holds credentials; put the key in api_key_env instead`,
			`config: replicas[0].url: "http://u:xxxxx@h:8000/?q#f" has a query or fragment; give the server's root URL`,
			`config: replicas[1].url: "http://xxxxx@h:8000/x y%zz" is not an absolute http(s) URL (write e.g. http://10.0.0.5:8000)`,
		}},
		{name: "unauthenticated mutations only on loopback", modify: func(c *Config) {
			c.AdminListen, c.Admin.AllowUnauthenticatedMutations = "0.0.0.0:9090", true
		}, want: []string{
			`config: admin.allow_unauthenticated_mutations: only allowed with admin_listen on a loopback address (127.0.0.1, ::1, localhost), got "0.0.0.0:9090": anyone on the network could add a replica and receive clients' keys; set admin_token`,
		}},
		{name: "unauthenticated mutations on loopback", modify: func(c *Config) {
			c.AdminListen, c.Admin.AllowUnauthenticatedMutations = "[::1]:9090", true
		}},
		{name: "unauthenticated opt-in with a token on the network", modify: func(c *Config) {
			c.AdminListen, c.AdminToken, c.Admin.AllowUnauthenticatedMutations = ":9090", "t0k", true
		}},
		{name: "retry statuses", modify: func(c *Config) {
			c.Proxy.RetryStatuses = []int{429, 200, 600, 503}
		}, want: []string{
			`config: proxy.retry_statuses[1]: 200 is not an error status (400-599): only a replica's refusal is tried elsewhere`,
			`config: proxy.retry_statuses[2]: 600 is not an error status (400-599): only a replica's refusal is tried elsewhere`,
		}},
		{name: "allowed hosts", modify: func(c *Config) {
			c.Admin.AllowedHosts = []string{"llmlb.internal", "llmlb.internal:9090", "*", "", "http://x", "a b", "h\xff"}
		}, want: []string{
			`config: admin.allowed_hosts[3]: empty host name`,
			`config: admin.allowed_hosts[4]: "http://x" is not a host name (write e.g. llmlb.internal, without scheme or path)`,
			`config: admin.allowed_hosts[5]: "a b" is not a host name (write e.g. llmlb.internal, without scheme or path)`,
			`config: admin.allowed_hosts[6]: "h\xff" contains a control or non-ASCII character (write the punycode form)`,
		}},
		{name: "addresses", modify: func(c *Config) { c.Listen, c.AdminListen = "8080", "" }, want: []string{
			`config: listen: "8080" is not host:port (write e.g. ":8080" or "127.0.0.1:9090")`,
			`config: admin_listen: empty address (write e.g. ":8080")`,
		}},
		{name: "same address twice", modify: func(c *Config) { c.AdminListen = c.Listen }, want: []string{
			`config: admin_listen: ":8080" is also the proxy's listen address; use two addresses`,
		}},
		{name: "ranges of our own sections", modify: func(c *Config) {
			c.Scrape.Interval, c.Scrape.Timeout = time.Second, 2*time.Second
			c.Scrape.MaxBodyBytes = 0
			c.Proxy.MaxAttempts = 0
			c.Server.ShutdownTimeout = -time.Second
			c.Log.Level = "verbose"
		}, want: []string{
			`config: scrape.timeout: 2s is longer than scrape.interval (1s): a hung replica would be seen late`,
			`config: scrape.max_body_bytes: must be > 0, got 0`,
			`config: proxy.max_attempts: must be > 0, got 0`,
			`config: server.shutdown_timeout: must be >= 0, got -1s`,
			`config: log.level: "verbose" is not one of debug, info, warn, error`,
		}},
		{name: "a replica that is llmlb itself", modify: func(c *Config) {
			c.Listen = ":8080"
			c.Replicas = []Replica{
				{Name: "self", URL: "http://127.0.0.1:8080", Metrics: "none"},
				{Name: "admin", URL: "http://localhost:9090"},
				{Name: "ok", URL: "http://127.0.0.1:8000"},
			}
		}, want: []string{
			`config: replicas[0].url: "http://127.0.0.1:8080" is llmlb's own listener ":8080": every request sent there would come back to llmlb`,
			`config: replicas[1].url: "http://localhost:9090" is llmlb's own listener "127.0.0.1:9090": every request sent there would come back to llmlb`,
		}},
		{name: "declared KV capacity", modify: func(c *Config) {
			c.Replicas = []Replica{{Name: "a", URL: "http://h1:8000", KVCacheTokens: -1}}
		}, want: []string{
			`config: replicas[0].kv_cache_tokens: must be >= 0, got -1`,
		}},
		{name: "model bounds", modify: func(c *Config) {
			c.Scrape.MaxModels, c.Scrape.MaxModelNameBytes = 0, -1
		}, want: []string{
			`config: scrape.max_models: must be > 0, got 0`,
			`config: scrape.max_model_name_bytes: must be > 0, got -1`,
		}},
		{name: "metrics modes", modify: func(c *Config) {
			c.Scrape.Metrics = "nnoe"
			c.Replicas = []Replica{
				{Name: "a", URL: "http://h1:8000", Metrics: "none"},
				{Name: "b", URL: "http://h2:8000", Metrics: "prometheus"},
				{Name: "c", URL: "http://h3:8000", Metrics: "Auto"},
				{Name: "d", URL: "http://h4:8000"},
			}
		}, want: []string{
			`config: replicas[1].metrics: "prometheus" is not one of auto, none`,
			`config: replicas[2].metrics: "Auto" is not one of auto, none (did you mean "auto"?)`,
			`config: scrape.metrics: "nnoe" is not one of auto, none (did you mean "none"?)`,
		}},
		{name: "no default metrics mode", modify: func(c *Config) { c.Scrape.Metrics = "" }, want: []string{
			`config: scrape.metrics: "" is not one of auto, none`,
		}},
		{name: "routing and request sections name their keys", modify: func(c *Config) {
			c.Routing.Policy = "random"
			c.Routing.Health.ProbingWindow = 0
			c.Request.DefaultOutputTokens = 0
		}, want: []string{
			`config: routing.policy: unknown policy "random" (want rr, least-request, sticky, prefix-tree, llm-d, llmlb, llmlb-warm or cost)`,
			`config: routing.health.probing_window: must be > 0, got 0s`,
			`config: request: request.default_output_tokens: 0 must be positive`,
		}},
		{name: "prefix-tree with prompt blocks", modify: func(c *Config) { c.Routing.Policy, c.Request.PromptBlocks = "prefix-tree", true }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.modify(&c)
			if d := cmp.Diff(tt.want, messages(c.Validate())); d != "" {
				t.Errorf("Validate mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// docs/SECURITY.md [13]: an admin listener on the network without a token is reported
// (serve logs it at WARN at start, validate prints it).
func TestWarnings(t *testing.T) {
	tests := []struct {
		name   string
		modify func(*Config)
		want   int
		substr string
	}{
		{"defaults", func(*Config) {}, 0, ""},
		{"network without token", func(c *Config) { c.AdminListen = "0.0.0.0:9090" }, 1, "reachable from the network and admin_token is not set"},
		{"all interfaces without token", func(c *Config) { c.AdminListen = ":9090" }, 1, "set admin_token"},
		{"network with token", func(c *Config) { c.AdminListen, c.AdminToken = ":9090", "t0k" }, 0, ""},
		{"opt-in with a token", func(c *Config) { c.AdminToken, c.Admin.AllowUnauthenticatedMutations = "t0k", true }, 1, "has no effect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.modify(&c)
			got := c.Warnings()
			if len(got) != tt.want || (tt.want > 0 && !strings.Contains(got[0], tt.substr)) {
				t.Errorf("Warnings() = %q, want %d containing %q", got, tt.want, tt.substr)
			}
		})
	}
}

func TestNotices(t *testing.T) {
	c := Default()
	if got := c.Notices(); len(got) != 0 {
		t.Fatalf("defaults: %q", got)
	}
	c.Replicas = []Replica{{Name: "a", URL: "http://a:8000"}, {Name: "b", URL: "http://b:8000", KVEvents: "tcp://b:5557"}}
	if got := c.Notices(); len(got) != 1 || !strings.Contains(got[0], "replicas[1].kv_events is set and no tokenizers are") {
		t.Fatalf("kv events without a tokenizer: %q", got)
	}
	if got := c.Warnings(); len(got) != 0 {
		t.Fatalf("a notice is no security warning: %q", got)
	}
	c.Tokenizers = []modeltok.Config{{Models: []string{"m"}, Path: "/models/m"}}
	if got := c.Notices(); len(got) != 0 {
		t.Fatalf("kv events with a tokenizer: %q", got)
	}
}

func TestApplyFlags(t *testing.T) {
	file := Default()
	file.Replicas = []Replica{{Name: "a", URL: "http://old:8000", APIKey: "sk", Models: []string{"m"}, Metrics: "none"}, {Name: "b", URL: "http://b:8000"}}
	tests := []struct {
		name             string
		listen, admin    string
		replicas         []string
		wantListen       string
		wantAdmin        string
		wantReplicas     []Replica
		wantErr          []string
		unchangedOnError bool
	}{
		{name: "no flags keep the file", wantListen: ":8080", wantAdmin: "127.0.0.1:9090", wantReplicas: file.Replicas},
		{name: "addresses", listen: ":9000", admin: "127.0.0.1:1", wantListen: ":9000", wantAdmin: "127.0.0.1:1", wantReplicas: file.Replicas},
		{name: "replicas replace the file's, keeping a same-named one's key, models and metrics", replicas: []string{"a=http://new:8000", "http://c:8001", "d=http://d:8000/?x=a=b"},
			wantListen: ":8080", wantAdmin: "127.0.0.1:9090", wantReplicas: []Replica{
				{Name: "a", URL: "http://new:8000", APIKey: "sk", Models: []string{"m"}, Metrics: "none"},
				{Name: "c:8001", URL: "http://c:8001"},
				{Name: "d", URL: "http://d:8000/?x=a=b"},
			}},
		{name: "bare URL with = in its query", replicas: []string{"http://e:8000/?k=v"}, wantListen: ":8080", wantAdmin: "127.0.0.1:9090",
			wantReplicas: []Replica{{Name: "e:8000", URL: "http://e:8000/?k=v"}}},
		{name: "bad flags", replicas: []string{"", "=http://x", "a=", "localhost:8000"}, wantErr: []string{
			`config: --replica "": empty replica; write name=URL or URL`,
			`config: --replica "=http://x": empty name before '='; write name=URL or URL`,
			`config: --replica "a=": no URL after '='; write name=URL`,
			`config: --replica "localhost:8000": "localhost:8000" is not an absolute http(s) URL (e.g. http://10.0.0.5:8000)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := file
			c.Replicas = append([]Replica(nil), file.Replicas...)
			err := ApplyFlags(&c, tt.listen, tt.admin, tt.replicas)
			if d := cmp.Diff(tt.wantErr, messages(err)); d != "" {
				t.Fatalf("errors mismatch (-want +got):\n%s", d)
			}
			if err != nil {
				return
			}
			if c.Listen != tt.wantListen || c.AdminListen != tt.wantAdmin {
				t.Errorf("listen %q admin %q, want %q %q", c.Listen, c.AdminListen, tt.wantListen, tt.wantAdmin)
			}
			if d := cmp.Diff(tt.wantReplicas, c.Replicas); d != "" {
				t.Errorf("replicas mismatch (-want +got):\n%s", d)
			}
		})
	}
	if err := ApplyFlags(nil, "", "", nil); err == nil {
		t.Error("ApplyFlags(nil): want an error")
	}
}

func TestRedacted(t *testing.T) {
	c := Default()
	c.AdminToken = "tok-secret"
	c.Replicas = []Replica{{Name: "a", URL: "http://a:8000", APIKey: "sk-secret"}, {Name: "b", URL: "http://b:8000"}}
	r := c.Redacted()
	if r.AdminToken != "<redacted>" || r.Replicas[0].APIKey != "<redacted>" || r.Replicas[1].APIKey != "" {
		t.Errorf("Redacted: token %q keys %q %q", r.AdminToken, r.Replicas[0].APIKey, r.Replicas[1].APIKey)
	}
	if c.AdminToken != "tok-secret" || c.Replicas[0].APIKey != "sk-secret" {
		t.Error("Redacted modified the original")
	}
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	log.Info("loaded", "config", c, "replica", c.Replicas[0])
	yml, err := Marshal(c.Redacted())
	if err != nil {
		t.Fatal(err)
	}
	for _, out := range []string{buf.String(), string(yml)} {
		if strings.Contains(out, "secret") || !strings.Contains(out, "<redacted>") {
			t.Errorf("secret leaked or not redacted in:\n%s", out)
		}
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	c := Default()
	c.AdminToken = "yes" // a string YAML 1.1 would read as a bool
	c.Replicas = []Replica{{Name: "a", URL: "http://a:8000", APIKey: "0123", Models: []string{"qwen", "true"}, Metrics: "none"},
		{Name: "b", URL: "http://b:8000", Models: []string{"m"}}} // metrics "": scrape.metrics
	c.Scrape.MaxBodyBytes = 1234567
	c.Routing.Affinity.PrefixTTL = 90 * time.Second
	c.Request.TenantHeaders = []string{}
	c.Tokenizers = []modeltok.Config{{Models: []string{"Qwen/Qwen2.5-7B-Instruct", "qwen"}, Path: "/models/qwen2.5"}}
	data, err := Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := parse(data, "marshalled", env)
	if err != nil {
		t.Fatalf("Parse(Marshal(c)): %v\n%s", err, data)
	}
	if d := cmp.Diff(c, got); d != "" {
		t.Errorf("round trip mismatch (-want +got):\n%s\n%s", d, data)
	}
	for _, want := range []string{"session_ttl: 1h\n", "prefix_ttl: 1m30s\n", "max_body_bytes: 32MiB\n", "interval: 3s\n"} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("Marshal output lacks %q:\n%s", want, data)
		}
	}
}

func TestSnake(t *testing.T) {
	for in, want := range map[string]string{
		"MaxInFlight": "max_in_flight", "SessionTTL": "session_ttl", "APIKey": "api_key", "URL": "url",
		"AdminListen": "admin_listen", "KVCacheUsage": "kv_cache_usage", "Seed": "seed", "HTTP2Enabled": "http2_enabled",
	} {
		if got := snake(in); got != want {
			t.Errorf("snake(%q) = %q, want %q", in, got, want)
		}
	}
}

// The example config is accepted by Parse and Validate (what `llmlb
// validate` runs) with no environment variables set.
func TestExampleConfig(t *testing.T) {
	c, err := Load("../../examples/llmlb.yaml")
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if len(c.Replicas) < 2 {
		t.Errorf("the example has %d replicas, want a fleet", len(c.Replicas))
	}
}

// docs/CONFIG.md documents every key, including ones colleagues add to the
// routing and request sections.
func TestDocsListEveryKey(t *testing.T) {
	doc, err := os.ReadFile("../../docs/CONFIG.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		if !bytes.Contains(doc, []byte("`"+k+"`")) {
			t.Errorf("docs/CONFIG.md does not document `%s`", k)
		}
	}
}
