package config

import (
	"strings"
	"testing"
)

func TestReplicaKVEvents(t *testing.T) {
	cases := []struct {
		name string
		yaml string
		want string // "" = valid
	}{
		{name: "publisher and replay", yaml: `replicas:
  - {name: a, url: "http://a:8000", kv_events: "tcp://a:5557", kv_events_replay: "tcp://a:5558"}
`},
		{name: "not tcp", yaml: `replicas:
  - {name: a, url: "http://a:8000", kv_events: "http://a:5557"}
`, want: `replicas[0].kv_events: kvevents: endpoint "http://a:5557": want tcp://host:port`},
		{name: "no port", yaml: `replicas:
  - {name: a, url: "http://a:8000", kv_events: "tcp://a"}
`, want: `replicas[0].kv_events: kvevents: endpoint "tcp://a": want tcp://host:port`},
		{name: "replay without publisher", yaml: `replicas:
  - {name: a, url: "http://a:8000", kv_events_replay: "tcp://a:5558"}
`, want: `replicas[0].kv_events_replay: needs kv_events`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := parseValid(t, c.yaml, c.want)
			if c.want == "" && cfg.Replicas[0].KVEvents != "tcp://a:5557" {
				t.Fatalf("kv_events = %q", cfg.Replicas[0].KVEvents)
			}
		})
	}
}

// parseValid parses and validates yaml and checks the error: none when
// want is "", else one containing want.
func parseValid(t *testing.T, yaml, want string) Config {
	t.Helper()
	cfg, err := Parse([]byte(yaml), "test.yaml")
	if err == nil {
		err = cfg.Validate()
	}
	switch {
	case want == "" && err != nil:
		t.Fatalf("error %v, want none", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Fatalf("error %v, want one containing %q", err, want)
	}
	return cfg
}

func TestTokenizers(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		yaml string
		want string // "" = valid
	}{
		{name: "a model directory", yaml: "tokenizers:\n  - {models: [qwen, Qwen/Qwen2.5-7B-Instruct], path: " + dir + "}\n"},
		{name: "no path", yaml: "tokenizers:\n  - {models: [qwen]}\n", want: "tokenizers[0].path: is required"},
		{name: "missing path", yaml: "tokenizers:\n  - {models: [qwen], path: " + dir + "/nope}\n", want: "tokenizers[0].path: stat " + dir + "/nope: no such file"},
		{name: "no models", yaml: "tokenizers:\n  - {path: " + dir + "}\n", want: "tokenizers[0].models: is required"},
		{name: "a model twice", yaml: "tokenizers:\n  - {models: [qwen], path: " + dir + "}\n  - {models: [llama, qwen], path: " + dir + "}\n",
			want: `tokenizers[1].models[1]: "qwen" has a tokenizer already (tokenizers[0])`},
		{name: "a typo", yaml: "tokenizers:\n  - {model: [qwen], path: " + dir + "}\n", want: "tokenizers[0].model: unknown key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { parseValid(t, c.yaml, c.want) })
	}
}
