package balancer

import (
	"testing"
	"time"
)

// A replica reporting num_gpu_blocks 2^32 (2^36 tokens) sized its share of
// the block index to match. A reported capacity is believed up to
// KVClaimFleetFactor times the other replicas' median and MaxKVCacheTokens;
// a declared one replaces it.
func TestKVCapacityClaimsAreBounded(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const honest, lie = 300_000, 1 << 36
	tests := []struct {
		name     string
		others   int // honest replicas beside the liar
		declared int
		want     float64
	}{
		{"alone: the absolute ceiling", 0, 0, MaxKVCacheTokens},
		{"in a fleet: 16x the median", 3, 0, KVClaimFleetFactor * honest},
		{"declared: believed as declared", 3, 1 << 30, 1 << 30},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.others {
				name := string(rune('a' + i))
				if err := b.AddReplica(ReplicaSpec{Name: name, URL: "http://" + name}, t0); err != nil {
					t.Fatal(err)
				}
				b.ObserveScrape(name, Snapshot{KVCacheTokens: honest}, nil, t0)
			}
			if err := b.AddReplica(ReplicaSpec{Name: "liar", URL: "http://liar", KVCacheTokens: tc.declared}, t0); err != nil {
				t.Fatal(err)
			}
			b.ObserveScrape("liar", Snapshot{KVCacheTokens: lie}, nil, t0)
			if got := b.byName["liar"].snap.KVCacheTokens; got != tc.want {
				t.Errorf("believed capacity %v, want %v", got, tc.want)
			}
			if got := b.byName["a"]; got != nil && got.snap.KVCacheTokens != honest {
				t.Errorf("an honest replica's capacity became %v", got.snap.KVCacheTokens)
			}
		})
	}
}
