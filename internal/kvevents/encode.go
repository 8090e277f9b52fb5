package kvevents

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// Encode writes b as vLLM's array_like msgspec structs do: the batch as
// [ts, events] (plus the rank when HasDPRank), each event as its tag followed
// by its fields in declaration order, integers in their shortest form and
// ts as a float64. The simulator publishes with it; Decode reads it back.
func Encode(b Batch) []byte {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	// Writes to a bytes.Buffer do not fail, so the errors below are nil.
	n := 2
	if b.HasDPRank {
		n = 3
	}
	_ = e.EncodeArrayLen(n)
	_ = e.EncodeFloat64(b.TS)
	_ = e.EncodeArrayLen(len(b.Events))
	for _, ev := range b.Events {
		encodeEvent(e, ev)
	}
	if b.HasDPRank {
		_ = e.EncodeInt(b.DPRank)
	}
	return buf.Bytes()
}

func encodeEvent(e *msgpack.Encoder, ev Event) {
	switch ev.Kind {
	case BlockStored:
		_ = e.EncodeArrayLen(1 + len(storedFields))
		_ = e.EncodeString(ev.Kind.String())
		encodeHashes(e, ev.BlockHashes)
		if ev.HasParent {
			_ = e.EncodeUint(ev.Parent)
		} else {
			_ = e.EncodeNil()
		}
		_ = e.EncodeArrayLen(len(ev.TokenIDs))
		for _, t := range ev.TokenIDs {
			_ = e.EncodeUint(uint64(t))
		}
		_ = e.EncodeInt(int64(ev.BlockSize))
		if ev.HasLoRA {
			_ = e.EncodeInt(ev.LoRAID)
		} else {
			_ = e.EncodeNil()
		}
		encodeMedium(e, ev.Medium)
	case BlockRemoved:
		_ = e.EncodeArrayLen(1 + len(removedFields))
		_ = e.EncodeString(ev.Kind.String())
		encodeHashes(e, ev.BlockHashes)
		encodeMedium(e, ev.Medium)
	default:
		_ = e.EncodeArrayLen(1)
		_ = e.EncodeString(AllBlocksCleared.String())
	}
}

func encodeHashes(e *msgpack.Encoder, hs []uint64) {
	_ = e.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = e.EncodeUint(h)
	}
}

func encodeMedium(e *msgpack.Encoder, m string) {
	if m == "" {
		_ = e.EncodeNil()
		return
	}
	_ = e.EncodeString(m)
}
