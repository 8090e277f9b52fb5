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
			cfg, err := Parse([]byte(c.yaml), "test.yaml")
			if err == nil {
				err = cfg.Validate()
			}
			switch {
			case c.want == "" && err != nil:
				t.Fatalf("error %v, want none", err)
			case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
				t.Fatalf("error %v, want one containing %q", err, c.want)
			case c.want == "" && cfg.Replicas[0].KVEvents != "tcp://a:5557":
				t.Fatalf("kv_events = %q", cfg.Replicas[0].KVEvents)
			}
		})
	}
}
