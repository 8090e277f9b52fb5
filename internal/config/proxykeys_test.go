package config

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestProxyHardeningKeys: the keys of the proxy-side defences (docs/SECURITY.md) have
// their defaults, parse from YAML and name themselves when invalid.
func TestProxyHardeningKeys(t *testing.T) {
	c := Default()
	if c.Proxy.StreamIdleTimeout != time.Minute || c.Server.MaxConnections != 10000 {
		t.Fatalf("defaults: stream_idle_timeout %s, max_connections %d", c.Proxy.StreamIdleTimeout, c.Server.MaxConnections)
	}
	got, err := Parse([]byte("proxy:\n  stream_idle_timeout: 90s\nserver:\n  max_connections: 500\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got.Proxy.StreamIdleTimeout != 90*time.Second || got.Server.MaxConnections != 500 {
		t.Fatalf("parsed: stream_idle_timeout %s, max_connections %d", got.Proxy.StreamIdleTimeout, got.Server.MaxConnections)
	}
	c.Proxy.StreamIdleTimeout, c.Server.MaxConnections = 0, -1
	want := []string{
		`config: proxy.stream_idle_timeout: must be > 0, got 0s`,
		`config: server.max_connections: must be > 0, got -1`,
	}
	if d := cmp.Diff(want, messages(c.Validate())); d != "" {
		t.Errorf("Validate mismatch (-want +got):\n%s", d)
	}
	if _, err := Parse([]byte("proxy:\n  stream_idle_timeout: soon\n"), "test.yaml"); err == nil || !strings.Contains(err.Error(), "stream_idle_timeout") {
		t.Errorf("a bad duration: %v, want an error naming the key", err)
	}
}
