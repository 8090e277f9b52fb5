package kvindex

import "slices"

// Pins mirror vLLM's reference counts: a block that a running request uses
// is not in the engine's free queue, so it is never evicted, and a full
// cache evicts among the other blocks only. Without them the index evicts
// a long request's prompt while the replica still holds it, keeps older
// blocks the replica has already evicted in its place, and over-predicts
// the cache of replicas whose KV is mostly held by their running batch.

// Pin is a handle on the blocks one Pin call marked as held; 0 pins nothing.
type Pin uint64

// Bits of a Pin (stored plus one, so that 0 is no pin): the entry, the
// replica and the replica's epoch at the time.
const (
	pinRepBits   = 20 // replica ids below 2^20 can be pinned
	pinEpochMask = 1<<(64-32-pinRepBits) - 1
)

// Pin marks the prompt's blocks that replica rep holds (its leading run) as
// used by a request in flight, until Unpin: they are not evicted, and new
// blocks evict the others only (with nothing else to evict, the replica's
// share grows past its capacity until the pins go). Pin the prompt when the
// replica has started it (its first token): waiting requests hold no blocks.
func (x *Index) Pin(rep int32, blocks []uint64) Pin {
	if rep < 0 || int(rep) >= len(x.reps) || rep >= 1<<pinRepBits || len(blocks) == 0 {
		return 0
	}
	r := &x.reps[rep]
	_, e := x.held(rep, blocks)
	if e == none {
		return 0
	}
	en := &x.ent[e]
	if en.pins++; en.pins == 1 {
		r.pinned++
		if len(r.pinList) >= 2*r.pinned+64 {
			x.compactPins(rep)
		}
		r.pinList = append(r.pinList, e)
		if en.next != interior {
			x.removeLeaf(r, e)
			en.next, en.prev = pinned, none
			x.settle(r)
		}
	}
	return Pin(uint64(r.epoch&pinEpochMask)<<(32+pinRepBits)|uint64(rep)<<32|uint64(uint32(e))) + 1
}

// Unpin releases a Pin; the blocks keep the recency they had (a Touch after
// it makes them the most recently used, as vLLM frees a finished request's
// blocks to the end of its free queue). A Pin whose replica was removed
// since, or one already released, does nothing.
func (x *Index) Unpin(p Pin) {
	if p == 0 {
		return
	}
	v := uint64(p - 1)
	e, rep, epoch := int32(uint32(v)), int32(v>>32&(1<<pinRepBits-1)), uint32(v>>(32+pinRepBits))
	if int(rep) >= len(x.reps) || int(e) >= len(x.ent) {
		return
	}
	r := &x.reps[rep]
	if r.epoch&pinEpochMask != epoch {
		return
	}
	en := &x.ent[e]
	if en.pins <= 0 {
		return
	}
	if en.pins--; en.pins == 0 {
		r.pinned--
		if en.next == pinned {
			x.heapPush(r, e)
			x.settle(r)
		}
	}
}

// unpinAll drops replica rep's pins (RemoveReplica): its entries become
// evictable and its outstanding Pins void.
func (x *Index) unpinAll(rep int32) {
	r := &x.reps[rep]
	for _, ei := range r.pinList {
		if !x.pinnedEntry(rep, ei) {
			continue // released since, or freed and reused
		}
		en := &x.ent[ei]
		en.pins = 0
		if en.next == pinned {
			x.heapPush(r, ei)
		}
	}
	r.pinList = r.pinList[:0]
	r.pinned = 0
	r.epoch++
	x.settle(r)
}

// compactPins drops the entries of rep's pin list that no longer hold pins,
// so that the list stays within twice the pinned entries.
func (x *Index) compactPins(rep int32) {
	r := &x.reps[rep]
	live := r.pinList[:0]
	for _, ei := range r.pinList {
		if x.pinnedEntry(rep, ei) {
			live = append(live, ei)
		}
	}
	slices.Sort(live) // an entry pinned, released and pinned again is listed twice
	r.pinList = slices.Compact(live)
}

// pinnedEntry reports whether entry ei is replica rep's and pinned.
func (x *Index) pinnedEntry(rep, ei int32) bool {
	en := &x.ent[ei]
	return en.pins > 0 && en.node != none && x.node[en.node].entryOf(rep) == ei
}
