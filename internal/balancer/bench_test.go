package balancer

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// BenchmarkSelectRelease measures one Select + Release on the llmlb policy
// with 100,000 live pins (session and prefix) and scraped loads of 0-8
// running, some replicas queued. Results: docs/benchmarks/LAB-2026.md "Routing core".
func BenchmarkSelectRelease(b *testing.B) {
	const livePins = 100_000
	for _, n := range []int{4, 32, 256, 1024} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Policy = policy.NameLLMLB
			bal, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(7, 7))
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("replica-%04d", i)
				if err := bal.AddReplica(ReplicaSpec{Name: names[i], URL: "http://" + names[i]}, t0); err != nil {
					b.Fatal(err)
				}
				bal.ObserveScrape(names[i], Snapshot{Running: float64(rng.IntN(9)), Waiting: float64(rng.IntN(4) / 3)}, nil, t0)
			}
			profiles := make([]Profile, livePins)
			for i := range profiles {
				profiles[i] = Profile{SessionKey: fmt.Sprint("session-", i), PromptTokens: 500 + rng.IntN(4000), OutputTokens: 200}
				if i%2 == 1 { // half the pins are prefix pins
					profiles[i] = Profile{PrefixKey: fmt.Sprint("prefix-", i), PromptTokens: 500 + rng.IntN(4000), OutputTokens: 200}
				}
			}
			for i := range profiles { // route each once: livePins pins
				res, err := bal.Select(&profiles[i], t0)
				if err != nil {
					b.Fatal(err)
				}
				bal.Release(res, OutcomeOK, t0)
			}
			now := t0.Add(time.Second)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				res, err := bal.Select(&profiles[i%livePins], now)
				if err != nil {
					b.Fatal(err)
				}
				bal.Release(res, OutcomeOK, now)
			}
			b.StopTimer()
			if got := pinCount(bal); got < livePins*8/10 { // repeated prefix spills drop some
				b.Fatalf("%d pins left, want >= %d", got, livePins*8/10)
			}
		})
	}
}

// BenchmarkSelectReleaseCost measures one Select + Release with policy cost
// whose index holds 100,000 blocks per replica (KV capacity 1.6M tokens):
// each replica's blocks from 64-block conversations that 1 in 10 replicas
// share (at 1,000 replicas a conversation's blocks have 100 holders); 9 in
// 10 requests continue a held conversation with 4 new blocks, 1 in 10
// starts a new one (64 new blocks).
// It reports the index's memory per (block, replica) entry. Results:
// docs/benchmarks/LAB-2026.md "Routing core".
func BenchmarkSelectReleaseCost(b *testing.B) {
	const perReplica, promptBlocks = 100_000, 64
	for _, n := range []int{4, 1000} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			cost, bal, names := benchCostFleet(b, n, perReplica*tokenize.BlockSize)
			// Conversation c is promptBlocks blocks; the replicas of group
			// r % 10 hold the group's convs conversations, 100K blocks.
			convs := perReplica / promptBlocks
			conv := func(c int) []uint64 {
				keys := make([]uint64, promptBlocks)
				for i := range keys {
					keys[i] = uint64(c)<<20 | uint64(i)
				}
				return tokenize.FromBlockKeys(promptBlocks*tokenize.BlockSize, keys).Blocks
			}
			var before runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			for r := range n {
				group := r % 10
				for k := range convs {
					cost.Record(names[r], conv(group*convs+k), perReplica*tokenize.BlockSize)
				}
			}
			var after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&after)
			entries := float64(n) * float64(convs*promptBlocks)
			rng := rand.New(rand.NewPCG(3, 3))
			profiles := make([]Profile, 4096)
			for i := range profiles {
				// 9 in 10 continue a held conversation with 4 new blocks
				// (a chat or agent turn); 1 in 10 is a new conversation. (At 4
				// replicas only groups 0-3 are held: drawing from all ten groups
				// made 6 in 10 requests new, 45 blocks computed a request.)
				c := rng.IntN(min(n, 10) * convs) // a conversation some replica holds
				keys := make([]uint64, promptBlocks, promptBlocks+4)
				for k := range keys {
					keys[k] = uint64(c)<<20 | uint64(k)
				}
				if i%10 == 0 {
					for k := range keys {
						keys[k] |= 1 << 62
					}
				} else {
					for k := range 4 {
						keys = append(keys, uint64(i)<<32|1<<63|uint64(k))
					}
				}
				profiles[i] = Profile{PromptTokens: len(keys) * tokenize.BlockSize, OutputTokens: 200,
					PromptBlocks: tokenize.FromBlockKeys(len(keys)*tokenize.BlockSize, keys).Blocks}
			}
			now := t0.Add(time.Second)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				res, err := bal.Select(&profiles[i%len(profiles)], now)
				if err != nil {
					b.Fatal(err)
				}
				bal.Release(res, OutcomeOK, now)
			}
			b.StopTimer()
			b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/entries, "index-B/entry")
		})
	}
}

// BenchmarkSelectReleaseCostPending measures one Select + Release with
// policy cost on parallel-prefill replicas (a learned recomputed share
// above recomputeSure) whose lists of prefixes pending a first token are
// empty or full (maxPending, 1024 a replica). Every replica holds a
// 16-block system prompt, so every candidate has a hit and looks for
// pending prefixes of the prompt; each holds 256 conversations of 64
// blocks; 9 in 10 requests continue one with 4 new blocks, 1 in 10 starts
// a new one. The lists are filled by requests routed each to one replica
// and never given a first token: lists=full with the benchmark's own
// requests (decisions find them pending, and spread), lists=other with
// requests that share only the system prompt with them. lists=empty
// routes those and cancels them: its decisions and index are those of
// lists=other, so the two differ by what the lookup itself costs.
// Results: docs/benchmarks/LAB-2026.md "The pending prefixes' lookup".
func BenchmarkSelectReleaseCostPending(b *testing.B) {
	const system, promptBlocks, convsPer, kvTokens = 16, 64, 256, 100_000 * tokenize.BlockSize
	for _, n := range []int{4, 32} {
		for _, lists := range []string{"empty", "other", "full"} {
			b.Run(fmt.Sprintf("replicas=%d/lists=%s", n, lists), func(b *testing.B) {
				cost, bal, names := benchCostFleet(b, n, kvTokens)
				keys := func(c int, extra int) []uint64 {
					k := make([]uint64, promptBlocks, promptBlocks+extra)
					for i := range k {
						k[i] = uint64(c)<<20 | uint64(i)
						if i < system {
							k[i] = 1<<40 | uint64(i) // the system prompt
						}
					}
					return k
				}
				for c := range n * convsPer {
					cost.Record(names[c%n], tokenize.FromBlockKeys(promptBlocks*tokenize.BlockSize, keys(c, 0)).Blocks, kvTokens)
				}
				for _, name := range names { // parallel prefill: a share learned
					for range 8 {
						cost.ObserveCached(name, policy.PrefillShape{Hit: 1000, Unscheduled: 1000}, 0)
					}
				}
				rng := rand.New(rand.NewPCG(3, 3))
				profiles := make([]Profile, 4096)
				for i := range profiles {
					k := keys(rng.IntN(n*convsPer), 4)
					if i%10 == 0 { // a new conversation
						for j := system; j < len(k); j++ {
							k[j] |= 1 << 62
						}
					} else { // a held one's next turn
						for j := range 4 {
							k = append(k, uint64(i)<<32|1<<63|uint64(j))
						}
					}
					profiles[i] = Profile{PromptTokens: len(k) * tokenize.BlockSize, OutputTokens: 200,
						PromptBlocks: tokenize.FromBlockKeys(len(k)*tokenize.BlockSize, k).Blocks}
				}
				for r, name := range names { // fill the lists
					one := []policy.Candidate{{Name: name, Live: true, KVCacheTokens: kvTokens}}
					for k := range 1024 {
						q := profiles[(r*1024+k)%len(profiles)]
						if lists != "full" {
							k := keys(r*1024+k, 0)
							for j := system; j < len(k); j++ {
								k[j] |= 1 << 61
							}
							q.PromptBlocks = tokenize.FromBlockKeys(len(k)*tokenize.BlockSize, k).Blocks
						}
						cost.Choose(&q, one, t0)
						if lists == "empty" {
							cost.Canceled(name, q.PromptBlocks)
						}
					}
				}
				now := t0.Add(time.Second)
				for i := range 2 * len(profiles) { // the index's table grows to its size
					selectRelease(b, bal, &profiles[i%len(profiles)], now)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					selectRelease(b, bal, &profiles[i%len(profiles)], now)
				}
			})
		}
	}
}

// benchCostFleet is a balancer with policy cost over n replicas named
// replica-0000..., each scraped with kvTokens of KV cache.
func benchCostFleet(b *testing.B, n, kvTokens int) (*policy.Cost, *Balancer, []string) {
	cost, err := policy.NewCost(policy.DefaultCostConfig())
	if err != nil {
		b.Fatal(err)
	}
	bal, err := NewWithPolicy(DefaultConfig(), cost)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("replica-%04d", i)
		if err := bal.AddReplica(ReplicaSpec{Name: names[i], URL: "http://" + names[i]}, t0); err != nil {
			b.Fatal(err)
		}
		bal.ObserveScrape(names[i], Snapshot{KVCacheTokens: float64(kvTokens)}, nil, t0)
	}
	return cost, bal, names
}

// selectRelease routes p and releases it as served.
func selectRelease(b *testing.B, bal *Balancer, p *Profile, now time.Time) {
	res, err := bal.Select(p, now)
	if err != nil {
		b.Fatal(err)
	}
	bal.Release(res, OutcomeOK, now)
}
