package config

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// The state section (shared state through Redis, docs/SHARED_STATE.md).
func TestStateSection(t *testing.T) {
	lookup := func(name string) (string, bool) {
		if name == "LLMLB_REDIS" {
			return "redis://:hunter2@10.0.0.9:6379/1", true
		}
		return "", false
	}
	tests := []struct {
		name  string
		yaml  string
		want  string // substring of the error; "" = valid
		check func(t *testing.T, c Config)
	}{
		{name: "off by default", yaml: "listen: :8080\n", check: func(t *testing.T, c Config) {
			if c.State.Enabled() || c.State.OpTimeout != 50*time.Millisecond || !c.State.ShareLoad || c.State.KeyPrefix != "llmlb:" {
				t.Fatalf("defaults: %+v", c.State)
			}
		}},
		{name: "keys", yaml: "state:\n  redis_url: redis://10.0.0.9:6379/0\n  op_timeout: 20ms\n  share_load: false\n  key_prefix: \"fleet-a:\"\n",
			check: func(t *testing.T, c Config) {
				if c.State.RedisURL != "redis://10.0.0.9:6379/0" || c.State.OpTimeout != 20*time.Millisecond || c.State.ShareLoad || c.State.KeyPrefix != "fleet-a:" {
					t.Fatalf("state: %+v", c.State)
				}
			}},
		{name: "the URL from the environment, redacted when printed", yaml: "state:\n  redis_url_env: LLMLB_REDIS\n",
			check: func(t *testing.T, c Config) {
				if !strings.Contains(c.State.RedisURL, "hunter2") {
					t.Fatalf("redis_url %q", c.State.RedisURL)
				}
				yml, err := Marshal(c.Redacted())
				if err != nil {
					t.Fatal(err)
				}
				var logged bytes.Buffer
				slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "config", c)
				for _, out := range []string{string(yml), logged.String()} {
					if strings.Contains(out, "hunter2") || !strings.Contains(out, "10.0.0.9:6379") {
						t.Fatalf("password leaked or URL lost:\n%s", out)
					}
				}
			}},
		{name: "not a Redis URL", yaml: "state:\n  redis_url: http://x:6379\n", want: "state.redis_url"},
		{name: "load TTL within the interval", yaml: "state:\n  load_ttl: 100ms\n", want: "state.load_ttl"},
		{name: "a typo is named", yaml: "state:\n  redis_ulr: redis://x:6379\n", want: `line 2: state.redis_ulr: unknown key (did you mean "redis_url"?)`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parse([]byte(tc.yaml), "test.yaml", lookup)
			if err == nil {
				err = c.Validate()
			}
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}
