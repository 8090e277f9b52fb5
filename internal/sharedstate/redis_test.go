package sharedstate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/testutil/pinview"
	"github.com/llmlb/llmlb/internal/testutil/redisserver"
)

// visible is how long a test waits for a change to reach the peer: far
// beyond the fraction of a second it takes, for a loaded CI machine.
const visible = 15 * time.Second

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(visible)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", visible, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// core is a balancer over replicas a, b, c, LIVE and idle.
func core(t *testing.T, policyName string) *balancer.Balancer {
	t.Helper()
	cfg := balancer.DefaultConfig()
	cfg.Policy = policyName
	b, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, n := range []string{"a", "b", "c"} {
		if err := b.AddReplica(balancer.ReplicaSpec{Name: n, URL: "http://" + n}, now); err != nil {
			t.Fatal(err)
		}
		b.ObserveScrape(n, balancer.Snapshot{}, nil, now)
	}
	return b
}

// instance connects core to Redis at url and runs the client until the
// test ends.
func instance(t *testing.T, url, id string, c *balancer.Balancer) *Redis {
	t.Helper()
	cfg := DefaultConfig()
	cfg.RedisURL, cfg.InstanceID = url, id
	cfg.KeyPrefix = "test:" + strings.ReplaceAll(t.Name(), "/", "_") + ":"
	cfg.OpTimeout = time.Second // a loaded CI machine with -race
	s, err := New(cfg, c, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetSharer(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: Run: %v", id, err)
		}
	})
	return s
}

func pinOf(b *balancer.Balancer, kind, key string) string {
	for _, p := range pinview.List(b, time.Now(), 0) {
		if p.Kind == kind && p.Key == key {
			return p.Replica
		}
	}
	return ""
}

// replica is the named replica's status in b now (one with PeerInFlight
// and KVCommitted -1 if b does not know it).
func replica(b *balancer.Balancer, name string) balancer.ReplicaStatus {
	for _, r := range b.Replicas(time.Now()) {
		if r.Name == name {
			return r
		}
	}
	return balancer.ReplicaStatus{PeerInFlight: -1, KVCommitted: -1}
}

func peerInFlight(b *balancer.Balancer, name string) int { return replica(b, name).PeerInFlight }

func TestRedisSharesPinsAndLoad(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := core(t, "llmlb"), core(t, "llmlb")
	ra := instance(t, srv.URL(), "A", a)
	instance(t, srv.URL(), "B", b)

	// A sees a busy: its session goes to b or c; B would rotate to a.
	a.ObserveScrape("a", balancer.Snapshot{Running: 2}, nil, time.Now())
	res, err := a.Select(&balancer.Profile{SessionKey: "s1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "B learns A's pin", func() bool { return pinOf(b, "session", "s1") == res.Replica })
	got, err := b.Select(&balancer.Profile{SessionKey: "s1"}, time.Now())
	if err != nil || got.Replica != res.Replica || got.Reason != balancer.ReasonAffinity {
		t.Fatalf("B routed s1 to %v (%v), want %s by affinity", got, err, res.Replica)
	}
	b.Release(got, balancer.OutcomeOK, time.Now())

	// A's request is still in flight: B counts it on that replica.
	eventually(t, "B counts A's in-flight request", func() bool { return peerInFlight(b, res.Replica) == 1 })
	if peerInFlight(a, res.Replica) != 0 {
		t.Fatal("A counts its own request as a peer's")
	}
	a.Release(res, balancer.OutcomeOK, time.Now())
	eventually(t, "B sees A's request end", func() bool { return peerInFlight(b, res.Replica) == 0 })

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(ra)
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 7 {
		t.Fatalf("metrics: %d series, %v", n, err)
	}
	if testutil.ToFloat64(collectorOf(ra, descUp)) != 1 {
		t.Fatal("llmlb_shared_state_up is not 1")
	}
}

func TestRedisSharesBlocks(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := core(t, "cost"), core(t, "cost")
	instance(t, srv.URL(), "A", a)
	instance(t, srv.URL(), "B", b)
	blocks := make([]uint64, 100)
	for i := range blocks {
		blocks[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	p := &balancer.Profile{PromptTokens: 1600, PromptBlocks: blocks}
	res, _ := a.Select(p, time.Now())
	a.Release(res, balancer.OutcomeOK, time.Now())
	eventually(t, "B routes the same prompt to A's replica, warm", func() bool {
		got, err := b.Select(&balancer.Profile{PromptTokens: 1600, PromptBlocks: blocks}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b.Release(got, balancer.OutcomeOK, time.Now())
		return got.Replica == res.Replica && got.Explanation.CachedTokens > 0
	})
}

func TestRedisDownRoutingGoesOnAndRecovers(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := core(t, "llmlb"), core(t, "llmlb")
	ra := instance(t, srv.URL(), "A", a)
	instance(t, srv.URL(), "B", b)
	res, _ := a.Select(&balancer.Profile{SessionKey: "before"}, time.Now())
	a.Release(res, balancer.OutcomeOK, time.Now())
	eventually(t, "B learns a pin", func() bool { return pinOf(b, "session", "before") != "" })

	srv.Stop()
	// Every request is routed while Redis is gone, and none waits for it:
	// Select never touches the network.
	for i := range 200 {
		res, err := a.Select(&balancer.Profile{SessionKey: "down-" + string(rune('a'+i%26))}, time.Now())
		if err != nil {
			t.Fatalf("request %d with Redis down: %v", i, err)
		}
		a.Release(res, balancer.OutcomeOK, time.Now())
	}
	eventually(t, "A reports Redis down", func() bool { return !ra.Up() })
	if ra.publishErrors.Load()+ra.readErrors.Load() == 0 {
		t.Fatal("no error counted")
	}

	srv.Start()
	eventually(t, "A reports Redis up again", ra.Up)
	// Sharing resumes by itself, at once: the first pin made once Redis is
	// back reaches B (A's writer, still in its backoff from the outage,
	// used to drop it).
	res, err := a.Select(&balancer.Profile{SessionKey: "after"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	a.Release(res, balancer.OutcomeOK, time.Now())
	eventually(t, "B learns the first pin made after the outage", func() bool { return pinOf(b, "session", "after") == res.Replica })
}

// A Redis that hangs (SIGSTOP) rather than refuses: every operation runs
// into its deadline, routing never waits for it, and sharing resumes when
// it answers again.
func TestRedisHungRoutingGoesOn(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := core(t, "llmlb"), core(t, "llmlb")
	ra := instance(t, srv.URL(), "A", a)
	instance(t, srv.URL(), "B", b)
	eventually(t, "A reaches Redis", ra.Up)
	srv.Pause()
	for i := range 200 {
		res, err := a.Select(&balancer.Profile{SessionKey: fmt.Sprintf("hung-%d", i)}, time.Now())
		if err != nil {
			t.Fatalf("request %d with Redis hung: %v", i, err)
		}
		a.Release(res, balancer.OutcomeOK, time.Now())
	}
	eventually(t, "A reports Redis down", func() bool { return !ra.Up() })
	srv.Resume()
	eventually(t, "sharing resumes by itself", func() bool {
		res, err := a.Select(&balancer.Profile{SessionKey: "resumed"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		a.Release(res, balancer.OutcomeOK, time.Now())
		return pinOf(b, "session", "resumed") == res.Replica
	})
}

// TestWriterHoldsOffOnlyWhileRedisIsDown: after a failed write the writer
// drops changes for its backoff, but not once Redis has been reached again
// (a pin made then would never reach the peers).
func TestWriterHoldsOffOnlyWhileRedisIsDown(t *testing.T) {
	var s Redis
	now := time.Now()
	if !s.holdingOff(now, now.Add(time.Second)) {
		t.Error("down, within the backoff: not holding off")
	}
	if s.holdingOff(now, now.Add(-time.Second)) {
		t.Error("down, past the backoff: holding off")
	}
	s.up.Store(true)
	if s.holdingOff(now, now.Add(time.Second)) {
		t.Error("Redis reached again within the backoff: holding off")
	}
}

func TestPublishNeverBlocks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.RedisURL, cfg.QueueSize = "redis://127.0.0.1:1/0", 4
	s, err := New(cfg, core(t, "llmlb"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Not running: the queue fills and the rest is dropped, counted.
	for range 10 {
		s.Publish(balancer.Delta{Kind: balancer.DeltaPin, Key: "k", Replica: "a"})
	}
	if got := s.dropped.Load(); got != 6 {
		t.Fatalf("dropped %d, want 6", got)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // substring of the error; "" = valid
	}{
		{"defaults, off", func(*Config) {}, ""},
		{"a redis URL", func(c *Config) { c.RedisURL = "redis://:secret@10.0.0.1:6379/2" }, ""},
		{"not a URL, password not echoed", func(c *Config) { c.RedisURL = "http://user:secret@x" }, "state.redis_url"},
		{"op timeout", func(c *Config) { c.OpTimeout = 0 }, "state.op_timeout"},
		{"load ttl not beyond the interval", func(c *Config) { c.LoadTTL = c.LoadInterval }, "state.load_ttl"},
		{"queue", func(c *Config) { c.QueueSize = 0 }, "state.queue_size"},
		{"stream", func(c *Config) { c.StreamMaxLen = 0 }, "state.stream_max_len"},
		{"prefix", func(c *Config) { c.KeyPrefix = "a b" }, "state.key_prefix"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mutate(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "secret") {
				t.Fatalf("error %v, want one naming %s without the password", err, tc.want)
			}
		})
	}
}

// collectorOf is one metric of s, for testutil.ToFloat64.
func collectorOf(s *Redis, d *prometheus.Desc) prometheus.Collector {
	return onlyDesc{s, d}
}

type onlyDesc struct {
	s *Redis
	d *prometheus.Desc
}

func (o onlyDesc) Describe(ch chan<- *prometheus.Desc) { ch <- o.d }
func (o onlyDesc) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric, 16)
	o.s.Collect(all)
	close(all)
	for m := range all {
		if m.Desc() == o.d {
			ch <- m
		}
	}
}

func kvCommitted(b *balancer.Balancer, name string) float64 { return replica(b, name).KVCommitted }

// TestRedisSharesCommittedKV: under policy cost, the KV one instance's
// requests commit on a replica reaches its peers with its load, so that
// their committed-KV signal counts it; it leaves when the request ends.
func TestRedisSharesCommittedKV(t *testing.T) {
	srv := redisserver.Start(t)
	a, b := core(t, "cost"), core(t, "cost")
	instance(t, srv.URL(), "A", a)
	instance(t, srv.URL(), "B", b)

	res, err := a.Select(&balancer.Profile{PromptTokens: 50_000}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "B counts the KV of A's prompt", func() bool { return kvCommitted(b, res.Replica) >= 50_000 })
	a.Release(res, balancer.OutcomeOK, time.Now())
	eventually(t, "B sees A's prompt end", func() bool { return kvCommitted(b, res.Replica) == 0 })
}
