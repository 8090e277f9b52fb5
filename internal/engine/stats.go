package engine

import (
	"math"
	"sort"
	"time"
)

// TTFTBuckets are vLLM's bounds for vllm:time_to_first_token_seconds
// (vllm/v1/metrics/loggers.py).
var TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}

// E2EBuckets are vLLM's bounds for vllm:e2e_request_latency_seconds
// (request_latency_buckets in vllm/v1/metrics/loggers.py).
var E2EBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
	40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}

// RequestLatencyBuckets are vLLM's request_latency_buckets
// (vllm/v1/metrics/loggers.py), shared by vllm:e2e_request_latency_seconds,
// vllm:request_queue_time_seconds and vllm:request_prefill_time_seconds.
var RequestLatencyBuckets = E2EBuckets

// InterTokenBuckets are vLLM's bounds for vllm:inter_token_latency_seconds
// (and its predecessor vllm:time_per_output_token_seconds).
var InterTokenBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}

// hist is the engine's internal histogram of durations: bounds and sum in
// integer nanoseconds, per-bucket (not cumulative) counts, converted to the
// cumulative Histogram only when Stats is read. Integer arithmetic makes
// n observations at once (observeN, observeRamp) exactly equal to n single
// ones, which keeps the fast-forwarded decode runs exact.
type hist struct {
	bounds []float64
	ns     []int64  // bounds in nanoseconds
	counts []uint64 // len(bounds)+1; the last is +Inf
	sum    int64    // nanoseconds

	lastV   int64 // memo: most observations repeat the previous value
	lastIdx int
}

func newHist(bounds []float64) hist {
	h := hist{bounds: bounds, ns: make([]int64, len(bounds)), counts: make([]uint64, len(bounds)+1), lastV: -1}
	for i, b := range bounds {
		h.ns[i] = int64(math.Round(b * 1e9))
	}
	return h
}

// bucket is the index of the bucket holding v; like Prometheus, a value
// equal to a bound falls in it.
func (h *hist) bucket(v int64) int {
	if v == h.lastV {
		return h.lastIdx
	}
	i := sort.Search(len(h.ns), func(i int) bool { return h.ns[i] >= v })
	h.lastV, h.lastIdx = v, i
	return i
}

// observe adds one observation of d.
func (h *hist) observe(d time.Duration) { h.observeN(d, 1) }

// observeN adds n observations of d in O(1) (a decode run's identical steps).
func (h *hist) observeN(d time.Duration, n uint64) {
	if n == 0 {
		return
	}
	v := int64(d)
	h.counts[h.bucket(v)] += n
	h.sum += v * int64(n)
}

// observeRamp adds, mult times each, the k values d0, d0+step, ...,
// d0+(k-1)*step (step >= 0): the gaps between the steps of a decode run whose
// step time grows with the batch's context. O(buckets crossed).
func (h *hist) observeRamp(d0, step time.Duration, k int, mult uint64) {
	if k <= 0 || mult == 0 {
		return
	}
	if step <= 0 {
		h.observeN(d0, uint64(k)*mult)
		return
	}
	v0, s := int64(d0), int64(step)
	done := 0 // values already counted
	for i := h.bucket(v0); done < k; i++ {
		upto := k // values <= bound i
		if i < len(h.ns) {
			upto = int(min(int64(k), (h.ns[i]-v0)/s+1))
		}
		if upto > done {
			h.counts[i] += uint64(upto-done) * mult
			done = upto
		}
	}
	kk := int64(k)
	h.sum += (kk*v0 + s*kk*(kk-1)/2) * int64(mult)
}

// snapshot returns a cumulative copy that shares nothing with the engine.
func (h *hist) snapshot() Histogram {
	out := Histogram{
		Bounds: append([]float64(nil), h.bounds...),
		Counts: make([]uint64, len(h.bounds)),
		Sum:    float64(h.sum) / 1e9,
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
