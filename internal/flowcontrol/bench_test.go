package flowcontrol

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

var tenantNames = func() []string {
	s := make([]string, 100)
	for i := range s {
		s[i] = "tenant-" + strconv.Itoa(i)
	}
	return s
}()

func benchItem(i int) Item {
	return Item{ID: uint64(i), Priority: i % 3, Tenant: tenantNames[(i*7)%len(tenantNames)],
		Tokens: int64(100 + (i*7919)%4000), Bytes: 2000}
}

// BenchmarkAdmitNext measures one Admit plus one Next with n requests
// queued (100 tenants, 3 priorities), the steady state of a saturated pool.
func BenchmarkAdmitNext(b *testing.B) {
	for _, n := range []int{10, 1000, 100_000} {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.MaxQueued = n + 1
			cfg.MaxQueuedBytes = 1 << 40
			q := New(cfg)
			for i := range n {
				q.Admit(benchItem(i), true, t0)
			}
			i := n
			b.ReportAllocs()
			for b.Loop() {
				now := t0.Add(time.Duration(i) * time.Microsecond)
				if d, _ := q.Admit(benchItem(i), true, now); d.Outcome != Queued {
					b.Fatalf("%+v", d)
				}
				it, _ := q.Next(now)
				q.Done(it.Tenant, it.Priority, now)
				i++
			}
		})
	}
}

// TestMemoryPerItem holds the per-request memory to EntryBytes.
func TestMemoryPerItem(t *testing.T) {
	if got := memoryPerItem(); got > EntryBytes {
		t.Errorf("%.0f B per queued request, more than EntryBytes (%d)", got, EntryBytes)
	} else {
		t.Logf("%.0f B per queued request", got)
	}
}

func memoryPerItem() float64 {
	const n = 100_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	cfg := DefaultConfig()
	cfg.MaxQueued = n
	cfg.MaxQueuedBytes = 1 << 40
	q := New(cfg)
	for i := range n {
		q.Admit(benchItem(i), true, t0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(q)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n
}

// BenchmarkMemoryPerItem reports the heap the queue holds per queued
// request (bodies aside: the caller owns them), with 100,000 queued.
func BenchmarkMemoryPerItem(b *testing.B) {
	for b.Loop() {
		b.ReportMetric(memoryPerItem(), "B/item")
	}
}

// TestConcurrentUse runs the shell's pattern from several goroutines (for
// -race): admit, dispatch or remove, done; and checks nothing leaks.
func TestConcurrentUse(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tenant.MaxConcurrent = 50
	q := New(cfg)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				now := t0.Add(time.Duration(i) * time.Millisecond)
				it := Item{ID: uint64(g*10_000 + i), Tenant: tenantNames[i%5], Tokens: 100}
				d, _ := q.Admit(it, i%3 != 0, now)
				switch {
				case d.Outcome == Dispatch:
					q.Done(it.Tenant, it.Priority, now)
				case d.Outcome == Queued && i%4 == 0:
					if _, ok := q.Remove(it.ID); ok {
						break
					}
					fallthrough
				default:
					if n, ok := q.Next(now); ok {
						q.Done(n.Tenant, n.Priority, now)
					}
				}
				_ = q.Stats(now)
			}
		})
	}
	wg.Wait()
	for {
		it, ok := q.Next(t0.Add(time.Hour))
		if !ok {
			break
		}
		q.Done(it.Tenant, it.Priority, t0.Add(time.Hour))
	}
	if st := q.Stats(t0.Add(time.Hour)); st.Queued != 0 || len(st.ByTenant) != 0 || st.Tenants != 0 {
		t.Fatalf("left over: %+v", st)
	}
}
