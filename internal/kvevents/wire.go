// Package kvevents reads the KV cache events that vLLM publishes (its
// `--kv-events-config` with `publisher: zmq`): which blocks an engine stored,
// which it removed, and when it dropped them all. This file is the wire
// format; subscriber.go is the ZMQ transport.
//
// A message is three ZMQ frames: a topic, an 8-byte big-endian sequence
// number, and a msgpack payload holding one KVEventBatch. vLLM encodes the
// batch with msgspec: structs marked array_like are msgpack arrays with their
// fields in declaration order, trailing fields that equal their default left
// out (omit_defaults), and a tagged struct (the events) carries its class
// name first; later vLLM dropped array_like, so the same structs arrive as
// maps keyed by field name with the tag under "type". Decode accepts both.
package kvevents

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Kind is the type of one KV cache event.
type Kind uint8

// The event kinds, named as vLLM's tagged structs are.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// String returns the event's vLLM tag.
func (k Kind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// MediumGPU is the medium of blocks in the engine's GPU KV cache.
const MediumGPU = "GPU"

// Event is one KV cache event. Block hashes are the engine's own: vLLM sends
// them as 64-bit integers, or as bytes (a SHA-256 digest) which Decode folds
// to the integer vLLM would send, its last eight bytes big-endian.
type Event struct {
	Kind        Kind
	BlockHashes []uint64
	// Parent is the hash of the block before the first stored one, when
	// HasParent (a stored chain that does not start at the prompt's head).
	Parent    uint64
	HasParent bool
	// TokenIDs are the tokens of the stored blocks, BlockSize per block.
	TokenIDs  []uint32
	BlockSize int
	// LoRAID is the adapter the blocks were computed with, when HasLoRA.
	LoRAID  int64
	HasLoRA bool
	// Medium is where the blocks live ("GPU", "CPU", ...); vLLM releases
	// before mediums send None or nothing, which decodes to "GPU".
	Medium string
}

// Batch is one KVEventBatch: the events of one engine step.
type Batch struct {
	TS     float64 // engine wall clock, seconds since the epoch
	Events []Event
	// DPRank is the data-parallel rank that published the batch, when HasDPRank.
	DPRank    int64
	HasDPRank bool
}

// MaxPayload bounds the size of one payload Decode accepts. vLLM batches one
// engine step; a step that stores a million tokens is far below it.
const MaxPayload = 16 << 20

// MaxDepth bounds the nesting of values Decode skips (unknown fields); the
// events themselves nest three deep.
const MaxDepth = 32

// ErrMalformed is wrapped by every error Decode returns for a payload that is
// not a KVEventBatch.
var ErrMalformed = errors.New("kvevents: malformed payload")

// Decode parses one KVEventBatch payload. It never panics, and it allocates
// at most a small multiple of len(p): every length is checked against the
// bytes left before anything is allocated.
func Decode(p []byte) (Batch, error) {
	if len(p) > MaxPayload {
		return Batch{}, fmt.Errorf("%w: %d bytes, limit %d", ErrMalformed, len(p), MaxPayload)
	}
	r := bytes.NewReader(p)
	w := wire{r: r, d: msgpack.NewDecoder(r)}
	b, err := w.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if r.Len() != 0 {
		return Batch{}, fmt.Errorf("%w: %d trailing bytes", ErrMalformed, r.Len())
	}
	return b, nil
}

type wire struct {
	r *bytes.Reader
	d *msgpack.Decoder
}

func (w *wire) peek() (byte, error) {
	c, err := w.d.PeekCode()
	if errors.Is(err, io.EOF) {
		return 0, io.ErrUnexpectedEOF
	}
	return c, err
}

// container reads an array or map header: its length, whether it is a map.
// The length is checked against the bytes left (an element takes one at
// least), so no slice sized from it can outgrow the payload.
func (w *wire) container() (n int, isMap bool, err error) {
	c, err := w.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err = w.d.DecodeArrayLen()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err = w.d.DecodeMapLen()
		isMap = true
	default:
		return 0, false, fmt.Errorf("want an array or a map, got code 0x%02x", c)
	}
	if err != nil {
		return 0, false, err
	}
	if n < 0 || n > w.r.Len() {
		return 0, false, fmt.Errorf("length %d exceeds the %d bytes left", n, w.r.Len())
	}
	return n, isMap, nil
}

func (w *wire) array() (int, error) {
	n, isMap, err := w.container()
	if err == nil && isMap {
		err = errors.New("want an array, got a map")
	}
	return n, err
}

// isNil consumes a nil if one comes next.
func (w *wire) isNil() (bool, error) {
	c, err := w.peek()
	if err != nil || c != msgpcode.Nil {
		return false, err
	}
	return true, w.d.DecodeNil()
}

func (w *wire) str() (string, error) {
	c, err := w.peek()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsString(c) {
		return "", fmt.Errorf("want a string, got code 0x%02x", c)
	}
	if err := w.checkLen(); err != nil {
		return "", err
	}
	return w.d.DecodeString()
}

// checkLen peeks a str or bin header and checks its length against the
// bytes left, so that the decoder's allocation is bounded by the payload.
func (w *wire) checkLen() error {
	rest := w.r.Len()
	if rest < 1 {
		return io.ErrUnexpectedEOF
	}
	var hdr [5]byte
	off, _ := w.r.Seek(0, io.SeekCurrent)
	k, _ := w.r.ReadAt(hdr[:min(5, rest)], off)
	c := hdr[0]
	var n, size int
	switch {
	case msgpcode.IsFixedString(c):
		return nil
	case c == msgpcode.Str8 || c == msgpcode.Bin8:
		n, size = 1, 2
	case c == msgpcode.Str16 || c == msgpcode.Bin16:
		n, size = 2, 3
	case c == msgpcode.Str32 || c == msgpcode.Bin32:
		n, size = 4, 5
	default:
		return nil
	}
	if k < size {
		return io.ErrUnexpectedEOF
	}
	var l uint64
	for _, b := range hdr[1 : 1+n] {
		l = l<<8 | uint64(b)
	}
	if l > uint64(rest-size) {
		return fmt.Errorf("length %d exceeds the %d bytes left", l, rest-size)
	}
	return nil
}

// integer reads a msgpack integer as the 64 bits vLLM means: a Python int
// beyond int64 arrives as uint64, a negative one (older vLLM hashed with
// Python's hash()) as int64; both keep their bits.
func (w *wire) integer() (uint64, error) {
	c, err := w.peek()
	if err != nil {
		return 0, err
	}
	if !isInt(c) {
		return 0, fmt.Errorf("want an integer, got code 0x%02x", c)
	}
	return w.d.DecodeUint64()
}

func isInt(c byte) bool {
	if msgpcode.IsFixedNum(c) {
		return true
	}
	switch c {
	case msgpcode.Uint8, msgpcode.Uint16, msgpcode.Uint32, msgpcode.Uint64,
		msgpcode.Int8, msgpcode.Int16, msgpcode.Int32, msgpcode.Int64:
		return true
	}
	return false
}

// hash reads a block hash: an integer, or bytes folded to their last eight
// bytes big-endian (shorter ones zero-extended on the left).
func (w *wire) hash() (uint64, error) {
	c, err := w.peek()
	if err != nil {
		return 0, err
	}
	if !msgpcode.IsBin(c) {
		return w.integer()
	}
	if err := w.checkLen(); err != nil {
		return 0, err
	}
	b, err := w.d.DecodeBytes()
	if err != nil {
		return 0, err
	}
	var buf [8]byte
	if len(b) >= 8 {
		copy(buf[:], b[len(b)-8:])
	} else {
		copy(buf[8-len(b):], b)
	}
	return binary.BigEndian.Uint64(buf[:]), nil
}

func (w *wire) hashes() ([]uint64, error) {
	n, err := w.array()
	if err != nil {
		return nil, err
	}
	hs := make([]uint64, n)
	for i := range hs {
		if hs[i], err = w.hash(); err != nil {
			return nil, fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
	}
	return hs, nil
}

func (w *wire) tokens() ([]uint32, error) {
	n, err := w.array()
	if err != nil {
		return nil, err
	}
	ts := make([]uint32, n)
	for i := range ts {
		v, err := w.integer()
		if err != nil {
			return nil, fmt.Errorf("token_ids[%d]: %w", i, err)
		}
		if v > math.MaxUint32 {
			return nil, fmt.Errorf("token_ids[%d]: %d out of range", i, int64(v))
		}
		ts[i] = uint32(v)
	}
	return ts, nil
}

func (w *wire) float() (float64, error) {
	c, err := w.peek()
	if err != nil {
		return 0, err
	}
	if c != msgpcode.Double && c != msgpcode.Float && !isInt(c) {
		return 0, fmt.Errorf("want a number, got code 0x%02x", c)
	}
	return w.d.DecodeFloat64()
}

// skip steps over one value of any shape without recursion, refusing to
// nest deeper than MaxDepth.
func (w *wire) skip() error {
	var pending [MaxDepth + 1]int
	depth := 0
	pending[0] = 1
	for depth >= 0 {
		if pending[depth] == 0 {
			depth--
			continue
		}
		pending[depth]--
		c, err := w.peek()
		if err != nil {
			return err
		}
		isArr := msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
		isMap := msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
		if !isArr && !isMap {
			if err := w.checkLen(); err != nil {
				return err
			}
			if err := w.d.Skip(); err != nil {
				return err
			}
			continue
		}
		n, m, err := w.container()
		if err != nil {
			return err
		}
		if depth == MaxDepth {
			return fmt.Errorf("values nest deeper than %d", MaxDepth)
		}
		depth++
		pending[depth] = n
		if m {
			pending[depth] = 2 * n
		}
	}
	return nil
}

// batch reads a KVEventBatch: [ts, events, dp_rank?] or its map form.
func (w *wire) batch() (Batch, error) {
	var b Batch
	n, isMap, err := w.container()
	if err != nil {
		return b, err
	}
	field := func(name string) error {
		var err error
		switch name {
		case "ts":
			b.TS, err = w.float()
		case "events":
			b.Events, err = w.events()
		case "data_parallel_rank":
			var null bool
			if null, err = w.isNil(); err == nil && !null {
				var v uint64
				v, err = w.integer()
				b.DPRank, b.HasDPRank = int64(v), true
			}
		default:
			err = w.skip()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	if isMap {
		seen := 0
		for range n {
			k, err := w.str()
			if err != nil {
				return b, fmt.Errorf("batch key: %w", err)
			}
			if k == "ts" || k == "events" {
				seen++
			}
			if err := field(k); err != nil {
				return b, err
			}
		}
		if seen < 2 {
			return b, errors.New("batch lacks ts or events")
		}
		return b, nil
	}
	names := []string{"ts", "events", "data_parallel_rank"}
	if n < 2 {
		return b, fmt.Errorf("batch has %d fields, want at least 2", n)
	}
	for i := range n {
		name := "extra"
		if i < len(names) {
			name = names[i]
		}
		if err := field(name); err != nil {
			return b, err
		}
	}
	return b, nil
}

func (w *wire) events() ([]Event, error) {
	n, err := w.array()
	if err != nil {
		return nil, err
	}
	evs := make([]Event, 0, min(n, 1024))
	for i := range n {
		e, err := w.event()
		if err != nil {
			return nil, fmt.Errorf("[%d]: %w", i, err)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// Field order of the tagged structs, as vLLM declares them; the array form
// carries them in this order after the tag.
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"}
	removedFields = []string{"block_hashes", "medium"}
)

func kindOf(tag string) (Kind, []string, error) {
	switch tag {
	case "BlockStored":
		return BlockStored, storedFields, nil
	case "BlockRemoved":
		return BlockRemoved, removedFields, nil
	case "AllBlocksCleared":
		return AllBlocksCleared, nil, nil
	}
	return 0, nil, fmt.Errorf("unknown event tag %q", tag)
}

// event reads one tagged event: ["BlockStored", fields...] or
// {"type": "BlockStored", name: value...}.
func (w *wire) event() (Event, error) {
	var e Event
	n, isMap, err := w.container()
	if err != nil {
		return e, err
	}
	if n < 1 {
		return e, errors.New("event without a tag")
	}
	if isMap {
		k, err := w.str()
		if err != nil {
			return e, err
		}
		if k != "type" {
			return e, fmt.Errorf("event map starts with %q, want the tag \"type\"", k)
		}
	}
	tag, err := w.str()
	if err != nil {
		return e, fmt.Errorf("tag: %w", err)
	}
	kind, fields, err := kindOf(tag)
	if err != nil {
		return e, err
	}
	e.Kind = kind
	got := 0
	for i := 1; i < n; i++ {
		name := "extra"
		if isMap {
			if name, err = w.str(); err != nil {
				return e, fmt.Errorf("%s key: %w", tag, err)
			}
		} else if i-1 < len(fields) {
			name = fields[i-1]
		}
		ok, err := w.eventField(&e, name)
		if err != nil {
			return e, fmt.Errorf("%s.%s: %w", tag, name, err)
		}
		if ok {
			got++
		}
	}
	if e.Medium == "" && kind != AllBlocksCleared {
		e.Medium = MediumGPU
	}
	// block_hashes is required; so are token_ids and block_size of a store.
	switch {
	case kind == BlockRemoved && e.BlockHashes == nil,
		kind == BlockStored && (e.BlockHashes == nil || e.TokenIDs == nil || e.BlockSize == 0):
		return e, fmt.Errorf("%s lacks a required field", tag)
	case kind == BlockStored && len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize:
		return e, fmt.Errorf("BlockStored has %d tokens for %d blocks of %d", len(e.TokenIDs), len(e.BlockHashes), e.BlockSize)
	}
	return e, nil
}

// eventField reads one field into e; fields this package does not use
// (lora_name, extra_keys, group_idx, ...) are skipped.
func (w *wire) eventField(e *Event, name string) (bool, error) {
	stored := e.Kind == BlockStored
	switch {
	case name == "block_hashes" && e.Kind != AllBlocksCleared:
		hs, err := w.hashes()
		if hs == nil && err == nil {
			hs = []uint64{}
		}
		e.BlockHashes = hs
		return true, err
	case name == "medium" && e.Kind != AllBlocksCleared:
		null, err := w.isNil()
		if err != nil || null {
			return err == nil, err
		}
		e.Medium, err = w.str()
		return true, err
	case name == "parent_block_hash" && stored:
		null, err := w.isNil()
		if err != nil || null {
			return err == nil, err
		}
		e.Parent, err = w.hash()
		e.HasParent = err == nil
		return true, err
	case name == "token_ids" && stored:
		ts, err := w.tokens()
		if ts == nil && err == nil {
			ts = []uint32{}
		}
		e.TokenIDs = ts
		return true, err
	case name == "block_size" && stored:
		v, err := w.integer()
		if err == nil && (v < 1 || v > 1<<16) {
			err = fmt.Errorf("%d out of range", int64(v))
		}
		e.BlockSize = int(v)
		return true, err
	case name == "lora_id" && stored:
		null, err := w.isNil()
		if err != nil || null {
			return err == nil, err
		}
		v, err := w.integer()
		e.LoRAID, e.HasLoRA = int64(v), err == nil
		return true, err
	}
	return false, w.skip()
}
