package engine

import (
	"github.com/llmlb/llmlb/internal/kvevents"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// kvEventLog is the engine's cache changes since the last drain, in order:
// a block cached (stored) or evicted (its hash forgotten).
type kvEventLog struct {
	ops []kvOp
}

type kvOp struct {
	hash    uint64
	stored  bool
	cleared bool // AllBlocksCleared (hash and stored unused)
}

func (l *kvEventLog) add(h uint64, stored bool) { l.ops = append(l.ops, kvOp{hash: h, stored: stored}) }

// RecordKVEvents turns on (or off) the log of what the engine caches and
// evicts, which DrainKVEvents hands out as vLLM's KV events.
func (e *Engine) RecordKVEvents(on bool) {
	switch {
	case on && e.kv.events == nil:
		e.kv.events = &kvEventLog{}
	case !on:
		e.kv.events = nil
	}
}

// DrainKVEvents appends the cache changes since the last call to dst as
// BlockStored and BlockRemoved events (consecutive changes of one kind in
// one event, in the order they happened) and clears the log. The engine
// has no token ids (its tokenizer is a pseudo one): stored events carry
// zeros, BlockSize per block, and the block hashes are what matches.
func (e *Engine) DrainKVEvents(dst []kvevents.Event) []kvevents.Event {
	l := e.kv.events
	if l == nil {
		return dst
	}
	for i := 0; i < len(l.ops); {
		if l.ops[i].cleared {
			dst = append(dst, kvevents.Event{Kind: kvevents.AllBlocksCleared})
			i++
			continue
		}
		j := i
		for j < len(l.ops) && !l.ops[j].cleared && l.ops[j].stored == l.ops[i].stored {
			j++
		}
		hs := make([]uint64, j-i)
		for k := range hs {
			hs[k] = l.ops[i+k].hash
		}
		ev := kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hs, Medium: kvevents.MediumGPU}
		if l.ops[i].stored {
			ev.Kind, ev.BlockSize = kvevents.BlockStored, tokenize.BlockSize
			ev.TokenIDs = make([]uint32, len(hs)*tokenize.BlockSize)
		}
		dst = append(dst, ev)
		i = j
	}
	l.ops = l.ops[:0]
	return dst
}

// ResetPrefixCache forgets every cached block, as vLLM's
// /reset_prefix_cache does, and reports whether it did: like vLLM it
// refuses while requests hold blocks. It logs AllBlocksCleared.
func (e *Engine) ResetPrefixCache() bool {
	c := e.kv
	if c.used() > 0 {
		return false
	}
	for i := range c.blocks {
		c.blocks[i].hashed = false
	}
	c.rebuild()
	c.gen++
	if c.events != nil {
		c.events.ops = append(c.events.ops[:0], kvOp{cleared: true})
	}
	return true
}
