package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/simreplica"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// TestKVEventsRouteToTheReplicaThatHoldsThePrefix runs llmlb (policy cost)
// in front of simulated replicas that publish their KV cache events over
// ZMQ. A prompt computed on sim-2 behind llmlb's back reaches llmlb only
// through sim-2's events, and the next request with that prefix goes
// there; sim-2's prefix cache reset (AllBlocksCleared) empties its entries.
func TestKVEventsRouteToTheReplicaThatHoldsThePrefix(t *testing.T) {
	if testing.Short() {
		t.Skip("opens ZMQ sockets")
	}
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: 3, Model: model, Seed: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pubs := make([]*simreplica.KVEvents, len(fleet.Replicas))
	for i, r := range fleet.Replicas {
		if pubs[i], err = r.PublishKVEvents(ctx, simreplica.KVEventsOptions{Endpoint: "tcp://127.0.0.1:0", Replay: "tcp://127.0.0.1:0"}); err != nil {
			t.Fatal(err)
		}
		go pubs[i].Run(ctx)
	}
	e := startOn(t, fleet, func(c *config.Config) {
		c.Routing.Policy = "cost"
		for i := range c.Replicas {
			c.Replicas[i].KVEvents, c.Replicas[i].KVEventsReplay = pubs[i].Endpoint(), pubs[i].ReplayEndpoint()
		}
	})
	idx := e.srv.KVEventsIndex()
	if idx == nil {
		t.Fatal("no KV events index though every replica publishes")
	}
	direct := func(rep *simreplica.Replica, content string) {
		t.Helper()
		res, err := http.Post(rep.URL()+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(content, 1)))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("direct request to %s: %d", rep.Name(), res.StatusCode)
		}
	}
	blocksOf := func(content string) []uint64 {
		return tokenize.FromText(tokenize.RenderChat([]tokenize.Message{{Role: "user", Content: content}})).Blocks
	}
	// ZMQ's PUB drops what it sends before a subscription arrives: probe
	// each replica until one of its events is seen.
	for _, r := range fleet.Replicas {
		probe := 0
		eventually(t, "llmlb subscribed to "+r.Name()+"'s events", func() bool {
			probe++
			content := fmt.Sprintf("probe %d %s", probe, strings.Repeat("x", 200))
			direct(r, content)
			_, n := idx.Match(r.Name(), blocksOf(content), time.Now())
			return n > 0
		})
	}
	// Each replica in turn computes a prompt behind llmlb's back; the next
	// request with that prefix must go there. The order is the reverse of
	// cost's rotation among equals, so a decision blind to the events
	// fails here.
	for i := range fleet.Replicas {
		holder := fleet.Replicas[len(fleet.Replicas)-1-i]
		shared := strings.Repeat(fmt.Sprintf("shared system prompt %d. ", i), 600)
		direct(holder, shared+"first question")
		want := blocksOf(shared)
		eventually(t, holder.Name()+"'s events report the shared prefix", func() bool {
			gpu, _ := idx.Match(holder.Name(), want, time.Now())
			return gpu == len(want)
		})
		for _, other := range fleet.Replicas {
			if gpu, _ := idx.Match(other.Name(), want, time.Now()); other != holder && gpu != 0 {
				t.Fatalf("%s's events report %d blocks of a prompt it never saw", other.Name(), gpu)
			}
		}
		code, rep, body := e.chat(chatBody(shared+"second question", 1), nil)
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		if rep != holder.Name() {
			t.Fatalf("routed to %s, want %s whose events hold the prefix", rep, holder.Name())
		}
	}
	holder := fleet.Replicas[1]

	// Reset sim-2's prefix cache once its requests are done: AllBlocksCleared.
	eventually(t, "sim-2 resets its prefix cache", pubs[1].ResetPrefixCache)
	eventually(t, "sim-2's entries emptied", func() bool {
		st, ok := idx.Stats(holder.Name())
		return ok && st.Blocks == 0
	})
}
