package kvindex

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// chain is a block's hash from its parent's and its content key, like
// tokenize.ChainHash: a hash stands for its whole prefix.
func chain(parent, key uint64) uint64 {
	h := parent*0x9e3779b97f4a7c15 ^ (key + 0x632be59bd9b4e019)
	h ^= h >> 31
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 29
	return h
}

// source yields the choices of a differential run: from a seeded generator
// (TestIndexMatchesReference) or from a fuzzer's bytes (FuzzIndexMatchesReference).
type source interface {
	intn(n int) int
	done() bool
}

type rngSource struct {
	rng  *rand.Rand
	left int
}

func (s *rngSource) intn(n int) int { return s.rng.IntN(n) }
func (s *rngSource) done() bool     { s.left--; return s.left < 0 }

type byteSource struct{ b []byte }

func (s *byteSource) intn(n int) int {
	if len(s.b) == 0 {
		return 0
	}
	v := int(binary.LittleEndian.Uint16(append(s.b[:min(2, len(s.b)):min(2, len(s.b))], 0, 0)))
	s.b = s.b[min(2, len(s.b)):]
	return v % n
}
func (s *byteSource) done() bool { return len(s.b) == 0 }

// diffRun drives Index and the reference model (the index before the
// leaf-only LRU) with the same operations and fails at the first
// observable difference: Match depths and deepest, Len, Idle, Capacity,
// Reuse, Nodes. Prompts are paths in a small tree of chained hashes (shared
// heads, prefixes of each other, repeats, empty ones); capacities are small
// so that most operations evict. The policy's pattern (Match, then Touch
// of the same slice) is the most frequent operation.
func diffRun(t testing.TB, src source, reps, maxCap, maxLen int) (steps, ghosts int) {
	x, ref := New(), newRefIndex()
	var prompts [][]uint64
	prompt := func() []uint64 {
		if len(prompts) > 0 && src.intn(3) == 0 {
			p := prompts[src.intn(len(prompts))] // a repeat, or a prefix of an earlier prompt
			if src.intn(2) == 0 {
				return p[:src.intn(len(p)+1)]
			}
			return p
		}
		n := src.intn(maxLen + 1)
		p := make([]uint64, n)
		h := uint64(src.intn(3)) // a few roots
		for i := range p {
			fan := 1 + i%3 // narrow near the root: shared heads
			h = chain(h, uint64(src.intn(fan)))
			p[i] = h
		}
		if len(prompts) < 256 {
			prompts = append(prompts, p)
		} else {
			prompts[src.intn(len(prompts))] = p
		}
		return p
	}
	depth, refDepth := make([]int32, reps), make([]int32, reps)
	check := func(op string) {
		t.Helper()
		for r := range int32(reps + 1) { // one id beyond any used
			if a, b := x.Len(r), ref.Len(r); a != b {
				t.Fatalf("step %d after %s: Len(%d) = %d, reference %d", steps, op, r, a, b)
			}
			if a, b := x.Idle(r), ref.Idle(r); a != b {
				t.Fatalf("step %d after %s: Idle(%d) = %d, reference %d", steps, op, r, a, b)
			}
			if a, b := x.Capacity(r), ref.Capacity(r); a != b {
				t.Fatalf("step %d after %s: Capacity(%d) = %d, reference %d", steps, op, r, a, b)
			}
		}
		if a, b := x.Reuse(), ref.Reuse(); a != b {
			t.Fatalf("step %d after %s: Reuse = %v, reference %v", steps, op, a, b)
		}
		if a, b := x.Nodes(), ref.Nodes(); a != b {
			t.Fatalf("step %d after %s: Nodes = %d, reference %d", steps, op, a, b)
		}
	}
	match := func(blocks []uint64, n int) {
		t.Helper()
		clear(depth)
		clear(refDepth)
		a, b := x.Match(blocks, depth[:n]), ref.Match(blocks, refDepth[:n])
		if a != b || !slices.Equal(depth, refDepth) {
			t.Fatalf("step %d: Match(%d blocks, %d replicas) = %d %v, reference %d %v", steps, len(blocks), n, a, depth, b, refDepth)
		}
	}
	type pinPair struct {
		x   Pin
		ref *refPin
	}
	var pins []pinPair
	// Routed prompts that may be refused later: the replica, the prompt,
	// what it held before and the Touch's stamp.
	type routed struct {
		rep     int32
		p       []uint64
		keep    int
		touched Touched
	}
	var sent []routed
	for ; !src.done(); steps++ {
		rep := int32(src.intn(reps))
		switch op := src.intn(26); {
		case op < 10: // the policy: match the fleet, touch the chosen replica
			p := prompt()
			match(p, reps)
			if src.intn(8) != 0 {
				keep := int(depth[rep])
				a, b := x.Touch(rep, p), ref.Touch(rep, p)
				if a != b {
					t.Fatalf("step %d: Touch did %+v, reference %+v", steps, a, b)
				}
				if len(sent) < 8 {
					sent = append(sent, routed{rep, p, keep, a})
				} else {
					sent[src.intn(len(sent))] = routed{rep, p, keep, a}
				}
			}
			check("match+touch")
		case op < 12: // a routed prompt is refused, now or a few operations later
			if len(sent) > 0 {
				i := src.intn(len(sent))
				f := sent[i]
				if src.intn(4) == 0 { // a keep too large forgets less
					f.keep += src.intn(len(f.p) - f.keep + 1)
				}
				x.Forget(f.rep, f.p, f.keep, f.touched)
				ref.Forget(f.rep, f.p, f.keep, f.touched)
				sent[i] = sent[len(sent)-1]
				sent = sent[:len(sent)-1]
				check("forget")
			}
		case op < 13: // a record: touch without a match
			p := prompt()
			x.Touch(rep, p)
			ref.Touch(rep, p)
			check("touch")
		case op < 14: // match, then touch a copy (no shortcut)
			p := prompt()
			match(p, reps)
			c := slices.Clone(p)
			x.Touch(rep, c)
			ref.Touch(rep, c)
			check("match+touch copy")
		case op < 15: // a depth slice that does not cover every replica
			match(prompt(), src.intn(reps+1))
			check("short match")
		case op < 18:
			c := src.intn(maxCap + 1)
			if src.intn(8) == 0 {
				c = 0
			}
			x.SetCapacity(rep, c)
			ref.SetCapacity(rep, c)
			check("set capacity")
		case op < 19:
			x.RemoveReplica(rep)
			ref.RemoveReplica(rep)
			check("remove")
		case op < 21: // a request starts: its prompt, touched at routing, is pinned
			p := prompt()
			if src.intn(4) != 0 {
				match(p, reps)
				x.Touch(rep, p)
				ref.Touch(rep, p)
			}
			pins = append(pins, pinPair{x.Pin(rep, p), ref.Pin(rep, p)})
			check("pin")
		case op < 23: // a request ends (possibly after its replica was removed)
			if len(pins) > 0 {
				i := src.intn(len(pins))
				x.Unpin(pins[i].x)
				ref.Unpin(pins[i].ref)
				pins[i] = pins[len(pins)-1]
				pins = pins[:len(pins)-1]
				check("unpin")
			}
		default: // another replica's Match between a Match and a Touch
			p, q := prompt(), prompt()
			match(p, reps)
			match(q, reps)
			x.Touch(rep, p)
			ref.Touch(rep, p)
			check("match, match other, touch")
		}
	}
	// Everything left, evicted replica by replica, in LRU order: the ghosts
	// must agree on the order too.
	for r := range int32(reps) {
		x.RemoveReplica(r)
		ref.RemoveReplica(r)
		check("final remove")
	}
	for _, p := range prompts {
		match(p, reps)
	}
	check("final matches")
	return steps, int(ref.refGhosts.added)
}

// TestIndexMatchesReference runs long random sequences over a range of
// fleet sizes and capacities; the largest runs push enough blocks through
// the ghosts to wrap their ring and halve their counts.
func TestIndexMatchesReference(t *testing.T) {
	for _, c := range []struct{ reps, maxCap, maxLen, steps int }{
		{1, 4, 8, 20_000},
		{3, 8, 12, 50_000},
		{5, 30, 20, 50_000},
		{8, 200, 40, 100_000},
		{16, 3, 6, 20_000},
		{4, 2000, 80, 100_000},
	} {
		t.Run(fmt.Sprintf("reps=%d,cap=%d,len=%d", c.reps, c.maxCap, c.maxLen), func(t *testing.T) {
			steps := c.steps
			if testing.Short() {
				steps /= 10
			}
			_, _ = diffRun(t, &rngSource{rng: rand.New(rand.NewPCG(uint64(c.reps), uint64(c.maxCap))), left: steps}, c.reps, c.maxCap, c.maxLen)
		})
	}
}

// FuzzIndexMatchesReference is TestIndexMatchesReference with the fuzzer
// choosing the operations.
func FuzzIndexMatchesReference(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte("\x01\x00\x05\x00\x07\x00\x03\x00\x02\x00\x01\x00\x00\x00\x09\x00\x04\x00"))
	rng := rand.New(rand.NewPCG(9, 9))
	for range 8 {
		b := make([]byte, 512)
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		reps := 1 + int(data[0])%6
		maxCap := 1 + int(data[1])%24
		_, _ = diffRun(t, &byteSource{b: data[2:]}, reps, maxCap, 16)
	})
}

// TestUnchainedHashesAreSafe feeds hashes that are not chained (a block's
// hash recurring under other prefixes, at other depths, twice in a prompt):
// the matches are then not exact, but nothing may break: no panic, no
// replica over its capacity, no node without a holder.
func TestUnchainedHashesAreSafe(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	const reps = 5
	x := New()
	depth := make([]int32, reps)
	for step := range 100_000 {
		p := make([]uint64, rng.IntN(12))
		for i := range p {
			p[i] = uint64(rng.IntN(20))
		}
		rep := int32(rng.IntN(reps))
		switch rng.IntN(7) {
		case 0:
			x.SetCapacity(rep, rng.IntN(10))
		case 1:
			x.RemoveReplica(rep)
		case 2:
			x.Touch(rep, p)
		case 3: // refused at once, or with a stale stamp or a wrong keep
			touched := x.Touch(rep, p)
			touched.Stamp -= uint32(rng.IntN(2))
			x.Forget(rep, p, rng.IntN(len(p)+1), touched)
		default:
			clear(depth)
			d := x.Match(p, depth[:rng.IntN(reps+1)])
			if d < 0 || d > len(p) {
				t.Fatalf("step %d: deepest %d for %d blocks", step, d, len(p))
			}
			x.Touch(rep, p)
		}
		total := 0
		for r := range int32(reps) {
			if x.Len(r) > x.Capacity(r) {
				t.Fatalf("step %d: replica %d holds %d, capacity %d", step, r, x.Len(r), x.Capacity(r))
			}
			total += x.Len(r)
		}
		if x.Nodes() > total {
			t.Fatalf("step %d: %d nodes for %d entries", step, x.Nodes(), total)
		}
	}
}
