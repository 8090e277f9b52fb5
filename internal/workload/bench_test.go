package workload

import (
	"testing"
	"time"
)

// BenchmarkGenerate measures the cost of one generated request (Peek, Pop
// and Complete, prompt building included) for each workload.
func BenchmarkGenerate(b *testing.B) {
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var w Workload
			n := 0
			for b.Loop() {
				if w == nil || w.Done() {
					var err error
					if w, err = New(name, Params{Seed: int64(n), Duration: 24 * time.Hour}); err != nil {
						b.Fatal(err)
					}
				}
				at, ok := w.Peek()
				if !ok {
					b.Fatal("closed-loop workload starved: Complete is called at once")
				}
				r := w.Pop()
				w.Complete(r, at+time.Second)
				n++
			}
		})
	}
}

// BenchmarkMooncakeReplay measures replaying the shared Mooncake sample.
func BenchmarkMooncakeReplay(b *testing.B) {
	path := tracePath(b, "mooncake_synthetic_trace.jsonl")
	b.ReportAllocs()
	for b.Loop() {
		w, err := OpenTrace(path, "", TraceOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for !w.Done() {
			w.Pop()
		}
	}
}
