package engine

import "sort"

// TTFTBuckets are vLLM's bounds for vllm:time_to_first_token_seconds
// (vllm/v1/metrics/loggers.py).
var TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// E2EBuckets are vLLM's bounds for vllm:e2e_request_latency_seconds
// (request_latency_buckets in vllm/v1/metrics/loggers.py).
var E2EBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// hist is the engine's internal histogram: per-bucket (not cumulative)
// counts, converted to the cumulative Histogram only when Stats is read.
type hist struct {
	bounds []float64
	counts []uint64 // len(bounds)+1; the last is +Inf
	sum    float64
}

func newHist(bounds []float64) hist {
	return hist{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

// observe adds v; like Prometheus, a value equal to a bound falls in it.
func (h *hist) observe(v float64) {
	h.counts[sort.SearchFloat64s(h.bounds, v)]++
	h.sum += v
}

// snapshot returns a cumulative copy that shares nothing with the engine.
func (h *hist) snapshot() Histogram {
	out := Histogram{
		Bounds: append([]float64(nil), h.bounds...),
		Counts: make([]uint64, len(h.bounds)),
		Sum:    h.sum,
	}
	var c uint64
	for i := range h.bounds {
		c += h.counts[i]
		out.Counts[i] = c
	}
	out.Count = c + h.counts[len(h.bounds)]
	return out
}

// Quantile estimates the q-quantile (0..1) by linear interpolation inside
// the bucket, as Prometheus' histogram_quantile does; it returns 0 for an
// empty histogram and the largest finite bound for the +Inf bucket.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	prevBound, prevCount := 0.0, uint64(0)
	for i, b := range h.Bounds {
		if float64(h.Counts[i]) >= rank {
			in := h.Counts[i] - prevCount
			if in == 0 {
				return b
			}
			return prevBound + (b-prevBound)*(rank-float64(prevCount))/float64(in)
		}
		prevBound, prevCount = b, h.Counts[i]
	}
	return h.Bounds[len(h.Bounds)-1]
}
