package admin

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/kvevents"
)

// kvSourceStub is a KVEventsSource with fixed subscriptions over a real index.
type kvSourceStub struct {
	sources []kvevents.Source
	idx     *kvevents.Index
}

func (s kvSourceStub) Sources() []kvevents.Source { return s.sources }
func (s kvSourceStub) Index() *kvevents.Index     { return s.idx }

// The KV events' metrics say which replicas are subscribed, what each one's
// events say it holds, and how old its last batch is: a subscribed replica
// that never published has only the subscription series.
func TestKVEventsMetrics(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	bal, err := balancer.New(balancer.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	idx := kvevents.NewIndex(0)
	idx.Apply("a", kvevents.Batch{Events: []kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3}},
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{1}},
	}}, t0)
	m := NewMetrics(bal, func() time.Time { return t0.Add(7 * time.Second) })
	m.RegisterKVEvents(kvSourceStub{sources: []kvevents.Source{{Replica: "a", Endpoint: "tcp://a:5557"}, {Replica: "b", Endpoint: "tcp://b:5557"}}, idx: idx})

	want := `
# HELP llmlb_kv_events_subscribed 1 for each replica whose KV cache events llmlb subscribes to (replicas[].kv_events, the admin API, discovery).
# TYPE llmlb_kv_events_subscribed gauge
llmlb_kv_events_subscribed{replica="a"} 1
llmlb_kv_events_subscribed{replica="b"} 1
# HELP llmlb_kv_events_blocks Blocks the replica's events say it holds (any medium), as recorded in the index.
# TYPE llmlb_kv_events_blocks gauge
llmlb_kv_events_blocks{replica="a"} 2
# HELP llmlb_kv_events_applied_total KV cache events applied to the index from the replica (stored, removed, cleared).
# TYPE llmlb_kv_events_applied_total counter
llmlb_kv_events_applied_total{replica="a"} 2
# HELP llmlb_kv_events_refused_blocks_total Stored blocks the index refused because the replica's share of the index budget was full.
# TYPE llmlb_kv_events_refused_blocks_total counter
llmlb_kv_events_refused_blocks_total{replica="a"} 0
# HELP llmlb_kv_events_unkeyed_blocks_total Stored blocks the index could not key by their token ids (with tokenizers configured): a parent it never saw, a LoRA adapter, a block size that is not a multiple of 16.
# TYPE llmlb_kv_events_unkeyed_blocks_total counter
llmlb_kv_events_unkeyed_blocks_total{replica="a"} 0
# HELP llmlb_kv_events_last_batch_age_seconds Seconds since the replica's last batch of events was applied (no series before its first batch, or after its entries were forgotten).
# TYPE llmlb_kv_events_last_batch_age_seconds gauge
llmlb_kv_events_last_batch_age_seconds{replica="a"} 7
`
	if err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(want),
		"llmlb_kv_events_subscribed", "llmlb_kv_events_blocks", "llmlb_kv_events_applied_total",
		"llmlb_kv_events_refused_blocks_total", "llmlb_kv_events_unkeyed_blocks_total", "llmlb_kv_events_last_batch_age_seconds"); err != nil {
		t.Fatal(err)
	}
}
