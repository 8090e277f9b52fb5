package config

import (
	"strings"
	"testing"
)

// TestDiscoveryValidation: each bad discovery: section is reported naming
// its key; a good one of each type passes.
func TestDiscoveryValidation(t *testing.T) {
	t.Setenv("GPUSTACK_KEY", "gs-secret")
	cases := []struct {
		name string
		yaml string
		want string // substring of the error; "" = valid
	}{
		{"static default", "listen: \":8080\"\n", ""},
		{"kubernetes service", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: vllm\n", ""},
		{"kubernetes selector", "discovery:\n  type: kubernetes\n  kubernetes:\n    label_selector: app=vllm,tier in (gpu)\n    port: \"8000\"\n", ""},
		{"dns srv", "discovery:\n  type: dns\n  dns:\n    name: _http._tcp.vllm\n    record: srv\n", ""},
		{"gpustack", "discovery:\n  type: gpustack\n  gpustack:\n    url: http://gpustack.internal\n    api_key_env: GPUSTACK_KEY\n", ""},
		{"unknown type", "discovery:\n  type: consul\n", "discovery.type"},
		{"kubernetes needs a target", "discovery:\n  type: kubernetes\n", "discovery.kubernetes.service"},
		{"kubernetes kv events ports", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: vllm\n    kv_events_port: kv-events\n    kv_events_replay_port: \"5558\"\n", ""},
		{"kubernetes bad kv events port", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: vllm\n    kv_events_port: \"0\"\n", "discovery.kubernetes.kv_events_port: 0 is not a port number"},
		{"kubernetes replay port needs kv events", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: vllm\n    kv_events_replay_port: \"5558\"\n", "discovery.kubernetes.kv_events_replay_port: needs kv_events_port"},
		{"kubernetes not both", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: a\n    label_selector: app=b\n", "discovery.kubernetes.label_selector: set service or label_selector, not both"},
		{"bad selector", "discovery:\n  type: kubernetes\n  kubernetes:\n    label_selector: \"app==(\"\n", "discovery.kubernetes.label_selector"},
		{"bad port number", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: a\n    port: \"70000\"\n", "discovery.kubernetes.port"},
		{"bad scheme", "discovery:\n  type: kubernetes\n  kubernetes:\n    service: a\n    scheme: ftp\n", "discovery.kubernetes.scheme"},
		{"dns needs a name", "discovery:\n  type: dns\n", "discovery.dns.name"},
		{"dns record", "discovery:\n  type: dns\n  dns:\n    name: x\n    record: cname\n", "discovery.dns.record"},
		{"dns interval", "discovery:\n  type: dns\n  dns:\n    name: x\n    interval: 0s\n", "discovery.dns.interval"},
		{"gpustack url", "discovery:\n  type: gpustack\n  gpustack:\n    url: gpustack.internal\n", "discovery.gpustack.url"},
		{"gpustack models", "discovery:\n  type: gpustack\n  gpustack:\n    url: http://g\n    models: [a, a]\n", "discovery.gpustack.models[1]"},
		{"unset env", "discovery:\n  api_key_env: NOPE_NOT_SET\n", "discovery.api_key_env"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.yaml), "test.yaml")
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

// TestDiscoverySecretsRedacted: discovery's keys never appear in a
// printed configuration.
func TestDiscoverySecretsRedacted(t *testing.T) {
	c := Default()
	c.Discovery.APIKey, c.Discovery.Gpustack.APIKey = "replica-secret", "gpustack-secret"
	r := c.Redacted()
	if r.Discovery.APIKey != redacted || r.Discovery.Gpustack.APIKey != redacted {
		t.Fatalf("not redacted: %+v", r.Discovery)
	}
	if c.Discovery.APIKey != "replica-secret" {
		t.Fatal("Redacted changed the original")
	}
}
