package server

import (
	"bufio"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// TestCostLearnsFromTheReplicasMetrics runs policy cost against simulated
// replicas: the scraper reads their KV capacity and decode steps, and a
// stream's first chunk retires its prefill from the replica's pending work
// while the stream still runs.
func TestCostLearnsFromTheReplicasMetrics(t *testing.T) {
	e := start(t, 2, func(c *config.Config) {
		c.Scrape.Interval, c.Scrape.Timeout = 200*time.Millisecond, 200*time.Millisecond
		c.Routing.Policy = "cost"
	})
	prof, err := engine.Lookup(engine.DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	e.waitReplicas("KV capacity from vllm:cache_config_info", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.KVCacheTokens != float64(prof.Blocks()*tokenize.BlockSize) {
				return false
			}
		}
		return true
	})

	// A long prompt streamed slowly: once its first chunk arrived, its
	// replica owes it no prefill, though it is still in flight.
	body := `{"model":"` + model + `","stream":true,"max_tokens":400,"messages":[{"role":"user","content":"` +
		strings.Repeat("a long document to read ", 2000) + `"}]}`
	req, _ := http.NewRequest(http.MethodPost, e.proxy+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	res, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	replica := res.Header.Get("X-LLMLB-Replica")
	if _, err := bufio.NewReader(res.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// The proxy records the first chunk once its bytes are on their way to
	// the client, so the client may read them a moment before that.
	e.waitReplicas("the first chunk to retire the prefill of a running stream", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.Name == replica {
				return r.InFlight == 1 && r.PendingPrefill == 0
			}
		}
		return false
	})
	e.waitReplicas("a decode step learned from vllm:inter_token_latency_seconds", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.Name == replica {
				// The prior is 30 ms; the simulator's step is 22 ms plus.
				return r.DecodeStepSeconds > 0 && r.DecodeStepSeconds != 0.03
			}
		}
		return false
	})
}
