package config

import (
	"fmt"

	"github.com/llmlb/llmlb/internal/replicaurl"
)

// Warnings lists what is valid but risky in c, one sentence each; `llmlb
// validate` prints them and `llmlb serve` logs them at WARN at start.
func (c Config) Warnings() []string {
	var out []string
	if c.AdminToken == "" && !replicaurl.IsLoopback(c.AdminListen) {
		out = append(out, fmt.Sprintf("admin_listen %q is reachable from the network and admin_token is not set: "+
			"/admin/replicas, /admin/pins (session ids) and /metrics are readable by anyone who can connect "+
			"(mutations stay disabled); set admin_token or listen on 127.0.0.1", c.AdminListen))
	}
	if c.Admin.AllowUnauthenticatedMutations && c.AdminToken != "" {
		out = append(out, "admin.allow_unauthenticated_mutations has no effect: admin_token is set, mutations need it")
	}
	return out
}

// Notices lists what is valid but probably not what the operator meant,
// one sentence each (no security risk: Warnings has those); `llmlb
// validate` prints them and `llmlb serve` logs them at WARN at start.
func (c Config) Notices() []string {
	var out []string
	if len(c.Tokenizers) == 0 {
		for i, r := range c.Replicas {
			if r.KVEvents != "" {
				out = append(out, fmt.Sprintf("replicas[%d].kv_events is set and no tokenizers are: the events are matched by the engine's own "+
					"block hashes, which only llmlb sim's replicas share with llmlb (a real vLLM's match nothing); "+
					"configure the model's tokenizer under tokenizers (docs/KV_EVENTS.md)", i))
				break
			}
		}
	}
	return out
}
