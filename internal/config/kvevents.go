package config

import "github.com/llmlb/llmlb/internal/kvevents"

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
