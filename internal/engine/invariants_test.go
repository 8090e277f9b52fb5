package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// checkInvariants verifies the block pool and the request records agree.
func (e *Engine) checkInvariants() error {
	c := e.kv
	// Free queue: one live entry per unreferenced block, none for others.
	n := 0
	seen := make([]bool, len(c.blocks))
	for _, fe := range c.fq[c.fhead:] {
		if !c.live(fe) {
			continue
		}
		if c.blocks[fe.block].ref != 0 || seen[fe.block] {
			return fmt.Errorf("free queue: block %d live with ref %d (seen %v)", fe.block, c.blocks[fe.block].ref, seen[fe.block])
		}
		seen[fe.block] = true
		n++
	}
	if n != c.numFree {
		return fmt.Errorf("free queue: %d live entries, numFree %d", n, c.numFree)
	}
	for i := range c.blocks {
		if c.blocks[i].ref == 0 && !seen[i] {
			return fmt.Errorf("block %d unreferenced but not in the free queue", i)
		}
	}
	// References: exactly the running requests' blocks.
	refs := make([]int32, len(c.blocks))
	for _, s := range e.running {
		if s.state != stRunning {
			return fmt.Errorf("request %d in running with state %d", s.req.ID, s.state)
		}
		if s.done {
			continue
		}
		if len(s.blocks) != blocksFor(s.computed) {
			return fmt.Errorf("request %d: %d blocks for %d computed tokens", s.req.ID, len(s.blocks), s.computed)
		}
		if s.computed > s.tokens() || s.outputs > s.req.MaxTokens {
			return fmt.Errorf("request %d: computed %d tokens %d outputs %d", s.req.ID, s.computed, s.tokens(), s.outputs)
		}
		for _, b := range s.blocks {
			refs[b]++
		}
	}
	for i := range refs {
		if refs[i] != c.blocks[i].ref {
			return fmt.Errorf("block %d: ref %d, running requests hold %d", i, c.blocks[i].ref, refs[i])
		}
		if refs[i] > 1 && !c.blocks[i].hashed {
			return fmt.Errorf("block %d shared by %d requests but not cached", i, refs[i])
		}
	}
	// Index: every hashed block is found under its hash, and nothing else.
	hashed := 0
	for i := range c.blocks {
		b := &c.blocks[i]
		if !b.hashed {
			continue
		}
		hashed++
		if j, ok := c.lookup(b.hash); !ok || j != int32(i) {
			return fmt.Errorf("block %d: hash not indexed (got %d,%v)", i, j, ok)
		}
	}
	if hashed > c.cached.used || c.cached.used > c.cached.limit {
		return fmt.Errorf("index: %d slots used (limit %d), %d blocks hashed", c.cached.used, c.cached.limit, hashed)
	}
	for _, s := range e.waiting[e.whead:] {
		if s.state != stWaiting || len(s.blocks) != 0 || s.computed != 0 {
			return fmt.Errorf("waiting request %d: state %d, %d blocks, computed %d", s.req.ID, s.state, len(s.blocks), s.computed)
		}
	}
	if got := len(e.running) + len(e.waiting) - e.whead; got != len(e.seqs) {
		return fmt.Errorf("%d requests in queues, %d known", got, len(e.seqs))
	}
	return nil
}

// TestInvariantsUnderChurn walks random scripts event by event on tight
// caches and checks the pool after every call.
func TestInvariantsUnderChurn(t *testing.T) {
	for _, seed := range []uint64{11, 12, 13} {
		for _, blocks := range []int{200, 600} {
			t.Run(fmt.Sprintf("seed%d/blocks%d", seed, blocks), func(t *testing.T) {
				p := testProfile()
				p.MaxNumSeqs = 5
				p.KVCacheTokens = blocks * tokenize.BlockSize
				p.MaxNumBatchedTokens = 384
				e := New(p)
				ops := randomOps(seed, 120)
				emit := func(Event) {}
				i := 0
				for steps := 0; steps < 1_000_000; steps++ {
					next, ok := e.NextEvent()
					if i < len(ops) && (!ok || !t0.Add(ops[i].at).After(next)) {
						now := t0.Add(ops[i].at)
						e.Advance(now, emit)
						if ops[i].add != nil {
							_ = e.Add(*ops[i].add, now)
						} else {
							e.Abort(ops[i].abort, now)
						}
						i++
					} else if ok {
						e.Advance(next, emit)
						// The benchmark driver relies on progress.
						if again, ok := e.NextEvent(); ok && !again.After(next) {
							t.Fatalf("NextEvent %v after Advance(%v)", again.Sub(t0), next.Sub(t0))
						}
					} else {
						break
					}
					if err := e.checkInvariants(); err != nil {
						t.Fatalf("after call %d: %v", steps, err)
					}
				}
				if st := e.Stats(); st.Running+st.Waiting != 0 || st.KVCacheUsage != 0 {
					t.Errorf("not drained: %+v", st)
				}
			})
		}
	}
}

// FuzzEngine drives a tiny engine with arbitrary calls and checks the pool
// invariants and event times after each: bad input must never panic or
// corrupt the cache.
func FuzzEngine(f *testing.F) {
	f.Add([]byte{0, 10, 3, 1, 20, 5, 2, 0, 3, 9})
	f.Add([]byte{0, 255, 255, 0, 255, 255, 0, 1, 1, 2, 1, 3, 200})
	f.Fuzz(fuzzEngine)
}

func fuzzEngine(t *testing.T, data []byte) {
	{
		p := testProfile()
		p.MaxNumSeqs = 3
		p.KVCacheTokens = 40 * tokenize.BlockSize
		p.MaxNumBatchedTokens = 100
		e := New(p)
		now := t0
		last := t0
		emit := func(ev Event) {
			if ev.At.Before(last) || ev.At.After(now) {
				t.Fatalf("event %+v outside [%v, %v]", ev, last.Sub(t0), now.Sub(t0))
			}
			last = ev.At
		}
		var id uint64
		for i := 0; i+2 < len(data); i += 3 {
			op, a, b := data[i]%5, int(data[i+1]), int(data[i+2])
			switch op {
			case 0:
				id++
				e.Advance(now, emit)
				_ = e.Add(Request{ID: id, Prompt: sharedPrompt(1, a%4*16, uint64(b%3), a*3), MaxTokens: b - 10, StreamTokens: a%2 == 0}, now)
			case 1:
				e.Advance(now, emit)
				e.Abort(uint64(a%int(id+1)), now)
			case 2:
				now = now.Add(time.Duration(a*b) * time.Millisecond)
				e.Advance(now, emit)
			case 3:
				if next, ok := e.NextEvent(); ok {
					now = later(now, next)
					e.Advance(now, emit)
				}
			case 4:
				e.SetSlowdown(float64(a) / 16)
			}
			if err := e.checkInvariants(); err != nil {
				t.Fatal(err)
			}
		}
		e.Advance(now.Add(24*time.Hour), func(Event) {})
		if st := e.Stats(); st.Running+st.Waiting != 0 || st.KVCacheUsage != 0 {
			t.Fatalf("not drained: %+v", st)
		}
	}
}
