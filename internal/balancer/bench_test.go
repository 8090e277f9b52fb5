package balancer

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/pins"
)

// BenchmarkSelectRelease measures one Select + Release on the llmlb policy
// with 100,000 live pins (session and prefix) and scraped loads of 0-8
// running, some replicas queued. Results: BENCHMARKS.md "Routing core".
func BenchmarkSelectRelease(b *testing.B) {
	const livePins = 100_000
	for _, n := range []int{4, 32, 256, 1024} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			bal, err := New(DefaultConfig())
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
				kind, key := pins.Session, profiles[i].SessionKey
				if key == "" {
					kind, key = pins.Prefix, profiles[i].PrefixKey
				}
				bal.pins.Bind(kind, key, names[rng.IntN(n)], t0)
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
			if got := bal.pins.Len(); got < livePins*8/10 { // repeated prefix spills drop some
				b.Fatalf("%d pins left, want >= %d", got, livePins*8/10)
			}
		})
	}
}
