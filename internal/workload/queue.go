package workload

import (
	"container/heap"
	"math/rand/v2"
	"time"
)

// queue holds pending requests in arrival order; ties go to the lower ID so
// that the order never depends on how the heap happened to be built.
type queue []*Request

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].At != q[j].At {
		return q[i].At < q[j].At
	}
	return q[i].ID < q[j].ID
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *queue) Push(x any)   { *q = append(*q, x.(*Request)) }
func (q *queue) Pop() any {
	old := *q
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	return r
}

func (q *queue) push(r *Request) { heap.Push(q, r) }
func (q *queue) pop() *Request   { return heap.Pop(q).(*Request) }
func (q queue) top() *Request {
	if len(q) == 0 {
		return nil
	}
	return q[0]
}

// newRand returns a PCG generator for one stream of a seeded run; streams
// are independent of each other and of the order in which they are drawn.
func newRand(seed int64, salt, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), mix(salt, stream)))
}

// draw returns a uniform integer in r.
func draw(rng *rand.Rand, r intRange) int {
	if r.Hi <= r.Lo {
		return r.Lo
	}
	return r.Lo + rng.IntN(r.Hi-r.Lo+1)
}

// drawDur returns a uniform duration in r.
func drawDur(rng *rand.Rand, r durRange) time.Duration {
	if r.Hi <= r.Lo {
		return r.Lo
	}
	return r.Lo + time.Duration(rng.Int64N(int64(r.Hi-r.Lo)+1))
}

// expGap returns a Poisson process's next inter-arrival gap at rate per second.
func expGap(rng *rand.Rand, rate float64) time.Duration {
	return time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
}

// saltOf names a generator: its workload name and seed, so that two parts of
// a mixed workload never share content by accident.
func saltOf(name string, seed int64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(name); i++ {
		h ^= uint64(name[i])
		h *= 1099511628211
	}
	return mix(h, uint64(seed))
}
