package config

import (
	"fmt"
	"os"

	"github.com/llmlb/llmlb/internal/kvevents"
	"github.com/llmlb/llmlb/internal/modeltok"
)

// kvEvents checks a replica's KV event endpoints: tcp://host:port each,
// and a replay socket only beside a publisher.
func (v *validator) kvEvents(key string, r Replica) {
	if r.KVEvents != "" {
		if err := kvevents.ValidateEndpoint(r.KVEvents); err != nil {
			v.add(key+".kv_events", "%s", err)
		}
	}
	if r.KVEventsReplay != "" {
		if r.KVEvents == "" {
			v.add(key+".kv_events_replay", "needs kv_events")
		} else if err := kvevents.ValidateEndpoint(r.KVEventsReplay); err != nil {
			v.add(key+".kv_events_replay", "%s", err)
		}
	}
}

// tokenizers checks the tokenizers' entries: a path that exists, at least
// one model, no model named twice. The files themselves are read by
// `llmlb serve` at start (modeltok.LoadAll), which reports what is wrong
// in them.
func (v *validator) tokenizers(list []modeltok.Config) {
	seen := map[string]int{}
	for i, t := range list {
		key := fmt.Sprintf("tokenizers[%d]", i)
		if t.Path == "" {
			v.add(key+".path", "is required: a model directory holding tokenizer.json, or a tokenizer.json")
		} else if _, err := os.Stat(t.Path); err != nil {
			v.add(key+".path", "%s", err)
		}
		if len(t.Models) == 0 {
			v.add(key+".models", "is required: the request \"model\" values this tokenizer serves")
		}
		for j, m := range t.Models {
			if first, dup := seen[m]; dup {
				v.add(fmt.Sprintf("%s.models[%d]", key, j), "%q has a tokenizer already (tokenizers[%d])", m, first)
				continue
			}
			seen[m] = i
		}
	}
}
