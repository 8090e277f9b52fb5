package balancer

import (
	"log/slog"
	"slices"
)

// Bounds on the KV capacity a replica reports (vllm:cache_config_info's
// num_gpu_blocks x block_size). The capacity sizes the replica's share of
// the cost policy's block index: a replica that claims 2^36 tokens would
// let the index keep every unique prompt sent there.
const (
	// MaxKVCacheTokens is the largest capacity believed from any replica:
	// 2^26 tokens (67M), well above a node of eight 141 GB GPUs serving a
	// small model.
	MaxKVCacheTokens = 1 << 26
	// KVClaimFleetFactor bounds a replica's capacity to this multiple of
	// the median capacity of the other replicas that report one.
	KVClaimFleetFactor = 16
)

// plausibleKV is the capacity believed of r when it reports claimed tokens:
// its declared capacity if any; else the claim, at most MaxKVCacheTokens
// and KVClaimFleetFactor times the other replicas' median. A claim cut
// down is logged once per replica. Called under b.mu.
func (b *Balancer) plausibleKV(r *replica, claimed float64) float64 {
	if r.kvDecl > 0 {
		return r.kvDecl
	}
	bound := float64(MaxKVCacheTokens)
	var others []float64
	for _, o := range b.replicas {
		if o != r && o.snap.KVCacheTokens > 0 {
			others = append(others, o.snap.KVCacheTokens)
		}
	}
	if len(others) > 0 {
		slices.Sort(others)
		bound = min(bound, KVClaimFleetFactor*others[len(others)/2])
	}
	if claimed <= bound {
		r.kvCut = false
		return claimed
	}
	if !r.kvCut {
		r.kvCut = true
		slog.Warn("balancer: replica reports an implausible KV capacity; believing less (declare replicas[].kv_cache_tokens to override)",
			slog.String("replica", r.name), slog.Float64("reported_tokens", claimed), slog.Float64("believed_tokens", bound))
	}
	return bound
}
