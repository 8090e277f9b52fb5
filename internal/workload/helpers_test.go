package workload

import (
	"container/heap"
	"testing"
	"time"
)

// completion is a request due to finish.
type completion struct {
	r  *Request
	at time.Duration
}

type completions []completion

func (c completions) Len() int { return len(c) }
func (c completions) Less(i, j int) bool {
	if c[i].at != c[j].at {
		return c[i].at < c[j].at
	}
	return c[i].r.ID < c[j].r.ID
}
func (c completions) Swap(i, j int) { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)   { *c = append(*c, x.(completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// drive plays w like the benchmark's driver: every request finishes service
// after service(r) and is reported through Complete in time order. It
// returns the requests in the order they were popped.
func drive(t testing.TB, w Workload, service func(r *Request) time.Duration) []*Request {
	t.Helper()
	return driveHook(t, w, service, nil)
}

// driveHook is drive with a hook called on every request as it is popped.
func driveHook(t testing.TB, w Workload, service func(r *Request) time.Duration, onPop func(*Request)) []*Request {
	t.Helper()
	var out []*Request
	var pend completions
	for {
		at, ok := w.Peek()
		if len(pend) > 0 && (!ok || pend[0].at <= at) {
			c := heap.Pop(&pend).(completion)
			w.Complete(c.r, c.at)
			continue
		}
		if !ok {
			if !w.Done() {
				t.Fatalf("workload not done but nothing pending and no completion outstanding")
			}
			return out
		}
		r := w.Pop()
		if r == nil || r.At != at {
			t.Fatalf("Pop after Peek at %v returned %+v", at, r)
		}
		if n := len(out); n > 0 && r.At < out[n-1].At {
			t.Fatalf("arrivals out of order: %v after %v", r.At, out[n-1].At)
		}
		out = append(out, r)
		if onPop != nil {
			onPop(r)
		}
		heap.Push(&pend, completion{r, r.At + service(r)})
	}
}

// fixed is a service time that ignores the request.
func fixed(d time.Duration) func(*Request) time.Duration {
	return func(*Request) time.Duration { return d }
}

// within reports whether got is within rel (a fraction) of want.
func within(got, want, rel float64) bool {
	return got >= want*(1-rel) && got <= want*(1+rel)
}

// sharedBlocks counts the leading blocks a and b have in common.
func sharedBlocks(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
