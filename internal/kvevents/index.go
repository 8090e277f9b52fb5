package kvevents

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// Index is what the replicas' own events say they hold: per replica, the
// set of block hashes stored and not since removed, with the media each
// block is in (a block can sit in the GPU cache and in a CPU offload at
// once). Unlike package kvindex it guesses nothing: a block enters on
// BlockStored and leaves on BlockRemoved or AllBlocksCleared.
//
// Blocks are keyed one of two ways (SetKeyByTokens). By default, by the
// engine's own hashes, so a prompt matches only where the caller hashes it
// as the engine does (llmlb's simulator does). Keyed by tokens, a stored
// block's key is computed from the token ids its event carries, chained
// from its parent's key as tokenize.FromTokenIDs chains a prompt tokenized
// with the model's own tokenizer: the engine's hash function and its seed
// (vLLM's NONE_HASH is random per process) never need reproducing.
//
// Each replica is held to a budget of blocks: a replica that reports more
// stores than it can hold (a flood, or a lie) keeps its first Budget blocks
// and has the rest refused and counted, so it cannot take memory from the
// others. An Index is safe for concurrent use: subscribers write it, the
// routing policy reads it; each call holds the lock for its own work only.
type Index struct {
	mu     sync.RWMutex
	budget int
	// byTokens is written under mu and read without it by KeyByTokens,
	// which the routing policy asks on every decision.
	byTokens atomic.Bool
	reps     map[string]*repBlocks
	// computed counts the blocks stored in a replica's GPU cache that it
	// did not hold there before (Computed).
	computed atomic.Uint64
	margin   float64   // SetMargin
	ghosts   ghostRing // blocks evicted from GPU caches (reuse.go)
}

// repBlocks is one replica's share of the index.
type repBlocks struct {
	blocks  map[uint64]media
	pending map[uint64]time.Time // blocks routed there, not yet reported: until when to count them
	// pendingSwept is when pending's expired blocks were last swept out
	// (at most once per sweepEvery).
	pendingSwept time.Time
	last         time.Time // when its last batch was applied
	// awaiting is when blocks were first routed there (Expect) after its
	// last batch: an engine given new blocks reports them within a step,
	// so a long wait means its publisher is gone. Zero: none awaited.
	awaiting time.Time
	refused  uint64 // stored blocks refused for the budget
	events   uint64
	// copies counts the further GPU copies of an engine block stored
	// while already held: vLLM does not de-duplicate its cache (two
	// requests computing one prefix at once each store it) and reports
	// each copy's eviction, so a block leaves with its last copy.
	copies map[uint64]uint32

	// Keyed by tokens only: engine maps an engine's block hash to the
	// keys of its tokens (one per tokenize.BlockSize tokens), so that its
	// children can be chained and its removal found; shared counts the
	// further engine blocks holding a key (equal tokens under different
	// engine hashes: another cache salt, say); unkeyed counts stored
	// blocks that could not be keyed.
	engine  map[uint64]keyRun
	shared  map[uint64]uint32
	unkeyed uint64

	marg margin  // reuse.go
	risk lruRisk // risk.go
}

// keyRun is the index keys of one engine block's tokens: last, and before
// it the keys of the engine block's earlier tokenize.BlockSize-token runs
// when the engine's blocks are larger.
type keyRun struct {
	last    uint64
	earlier []uint64
}

// media is a set of media, one bit each.
type media uint8

const (
	onGPU media = 1 << iota
	onCPU
	onOther
)

func mediumBit(m string) media {
	switch m {
	case MediumGPU, "":
		return onGPU
	case "CPU", "cpu":
		return onCPU
	}
	return onOther
}

// DefaultBudget is the blocks one replica may hold in the index: 2^20
// blocks, 16M tokens at vLLM's block size of 16, about 40 MB of map.
const DefaultBudget = 1 << 20

// NewIndex returns an empty index holding at most budget blocks per replica
// (DefaultBudget if budget < 1).
func NewIndex(budget int) *Index {
	if budget < 1 {
		budget = DefaultBudget
	}
	return &Index{budget: budget, reps: make(map[string]*repBlocks)}
}

func (x *Index) rep(name string) *repBlocks {
	r := x.reps[name]
	if r == nil {
		r = &repBlocks{blocks: make(map[uint64]media), pending: make(map[uint64]time.Time), copies: make(map[uint64]uint32)}
		r.risk.use, r.risk.busy = make(map[uint64]uint32), make(map[uint64]busyMark)
		if x.byTokens.Load() {
			r.engine, r.shared = make(map[uint64]keyRun), make(map[uint64]uint32)
		}
		x.reps[name] = r
	}
	return r
}

// SetKeyByTokens chooses how blocks are keyed: by the token ids events
// carry (true), for prompts hashed with tokenize.FromTokenIDs from the
// model's own tokenizer, or by the engine's hashes (false, the default).
// A change forgets every replica's entries, which no longer match the
// prompts; their next events rebuild them.
func (x *Index) SetKeyByTokens(on bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.byTokens.Load() == on {
		return
	}
	x.byTokens.Store(on)
	clear(x.reps)
}

// KeyByTokens reports whether blocks are keyed by their token ids.
func (x *Index) KeyByTokens() bool { return x.byTokens.Load() }

// Apply records one batch from replica rep, received at now. It returns how
// many stored blocks the budget refused.
func (x *Index) Apply(rep string, b Batch, now time.Time) (refused int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.rep(rep)
	r.last, r.awaiting = now, time.Time{}
	byTokens := x.byTokens.Load()
	for _, e := range b.Events {
		r.events++
		bit := mediumBit(e.Medium)
		switch {
		case byTokens && e.Kind == BlockStored:
			refused += x.storeByTokens(r, e, bit)
		case byTokens && e.Kind == BlockRemoved:
			for _, h := range e.BlockHashes {
				x.removeByTokens(r, h, bit)
			}
		case e.Kind == BlockStored:
			for _, h := range e.BlockHashes {
				m, ok := r.blocks[h]
				if bit == onGPU && m&onGPU != 0 {
					r.copies[h]++
					continue
				}
				if !ok && len(r.blocks) >= x.budget {
					refused++
					continue
				}
				if bit == onGPU && m&onGPU == 0 {
					x.gpuStored(r, h)
				}
				r.blocks[h] = m | bit
				delete(r.pending, h)
			}
		case e.Kind == BlockRemoved:
			for _, h := range e.BlockHashes {
				if bit == onGPU && r.dropCopy(h) {
					continue
				}
				delete(r.pending, h)
				m, ok := r.blocks[h]
				if !ok {
					continue
				}
				if bit == onGPU && m&onGPU != 0 {
					x.gpuLeft(r, h)
				}
				if m &^= bit; m == 0 {
					delete(r.blocks, h)
				} else {
					r.blocks[h] = m
				}
			}
		case e.Kind == AllBlocksCleared:
			r.clear()
		}
	}
	r.refused += uint64(refused)
	return refused
}

// dropCopy forgets one further copy of engine block h, if it has one.
func (r *repBlocks) dropCopy(h uint64) bool {
	switch n := r.copies[h]; n {
	case 0:
		return false
	case 1:
		delete(r.copies, h)
	default:
		r.copies[h] = n - 1
	}
	return true
}

// clear forgets every block the replica holds.
func (r *repBlocks) clear() {
	clear(r.blocks)
	clear(r.pending)
	clear(r.copies)
	clear(r.engine)
	clear(r.shared)
	r.marg.gpu = 0
	r.risk.reset()
}

// storeByTokens records a BlockStored event keyed by its tokens and
// returns how many keys the budget refused. A block is left out, and
// counted unkeyed, when its key cannot be the one a prompt gets: its
// parent is unknown (stored before llmlb subscribed, or itself left out),
// it was computed with a LoRA adapter (its prompt's tokens are the base
// model's), or the engine's block size is not a multiple of
// tokenize.BlockSize. Every later block of the event chains from it, so
// they are left out too.
func (x *Index) storeByTokens(r *repBlocks, e Event, bit media) (refused int) {
	bs := e.BlockSize
	parent := tokenize.TokenRootHash
	ok := bs > 0 && bs%tokenize.BlockSize == 0 && len(e.TokenIDs) == bs*len(e.BlockHashes) &&
		!(e.HasLoRA && e.LoRAID != 0)
	if ok && e.HasParent {
		var run keyRun
		run, ok = r.engine[e.Parent]
		parent = run.last
	}
	if !ok {
		r.unkeyed += uint64(len(e.BlockHashes))
		return 0
	}
	for i, h := range e.BlockHashes {
		if old, dup := r.engine[h]; dup {
			// Stored again: another copy, or another medium. The same
			// tokens under the same parent give the same keys.
			if bit == onGPU && r.blocks[old.last]&onGPU != 0 {
				r.copies[h]++
			}
			x.mark(r, old, bit)
			parent = old.last
			continue
		}
		// The budget bounds the engine hashes too: a replica that
		// reports one block under a million hashes holds one key.
		n := bs / tokenize.BlockSize
		if len(r.blocks)+n > x.budget || len(r.engine) >= x.budget {
			refused += len(e.BlockHashes) - i
			break
		}
		run := keyRun{}
		if n > 1 {
			run.earlier = make([]uint64, 0, n-1)
		}
		toks := e.TokenIDs[i*bs : (i+1)*bs]
		for j := range n {
			parent = tokenize.ChainHash(parent, tokenize.KeyOfTokens(toks[j*tokenize.BlockSize:(j+1)*tokenize.BlockSize]))
			if j < n-1 {
				run.earlier = append(run.earlier, parent)
			}
			if _, held := r.blocks[parent]; held {
				r.shared[parent]++
			}
		}
		run.last = parent
		r.engine[h] = run
		x.mark(r, run, bit)
	}
	return refused
}

// mark records run's keys as held by r in medium bit.
func (x *Index) mark(r *repBlocks, run keyRun, bit media) {
	for _, k := range run.earlier {
		x.markKey(r, k, bit)
	}
	x.markKey(r, run.last, bit)
}

// markKey records key k as held by r in medium bit.
func (x *Index) markKey(r *repBlocks, k uint64, bit media) {
	m := r.blocks[k]
	if bit == onGPU && m&onGPU == 0 {
		x.gpuStored(r, k)
	}
	r.blocks[k] = m | bit
	delete(r.pending, k)
}

// removeByTokens records that the engine block h left medium bit. A key
// that another engine block also holds stays.
func (x *Index) removeByTokens(r *repBlocks, h uint64, bit media) {
	run, ok := r.engine[h]
	if !ok || (bit == onGPU && r.dropCopy(h)) {
		return
	}
	m := r.blocks[run.last] &^ bit
	for _, k := range run.earlier {
		x.unmark(r, k, m, bit)
	}
	x.unmark(r, run.last, m, bit)
	if m == 0 {
		delete(r.engine, h)
	}
}

// unmark leaves key k in media m, or, when m is empty, drops it unless
// another engine block holds it too.
func (x *Index) unmark(r *repBlocks, k uint64, m media, bit media) {
	delete(r.pending, k)
	if bit == onGPU && r.blocks[k]&onGPU != 0 && r.shared[k] == 0 {
		x.gpuLeft(r, k)
	}
	switch n := r.shared[k]; {
	case m != 0:
		r.blocks[k] = m
	case n == 1:
		delete(r.shared, k)
	case n > 1:
		r.shared[k] = n - 1
	default:
		delete(r.blocks, k)
	}
}

// Clear forgets everything replica rep holds but keeps it known, as after a
// sequence gap that could not be replayed: its next events rebuild it.
func (x *Index) Clear(rep string, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.rep(rep)
	r.clear()
	r.last, r.awaiting = now, time.Time{}
}

// Remove forgets replica rep altogether (it left the pool).
func (x *Index) Remove(rep string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.reps, rep)
}

// Expire forgets every replica whose events stopped: its last batch is
// older than now-maxAge and either it is not in live (its health checks
// fail, or nothing says) or blocks routed to it more than maxAge ago are
// still unreported. vLLM publishes only when its cache changes, so an
// engine that serves nothing is silent though it keeps its cache: a live
// replica that was given nothing new keeps its entries. Keeping them is
// safe because its next batch is checked against the sequence: a gap is
// replayed or clears the entries, a restart clears them. It returns the
// replicas it forgot, sorted.
func (x *Index) Expire(now time.Time, maxAge time.Duration, live map[string]bool) []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var gone []string
	for name, r := range x.reps {
		if now.Sub(r.last) <= maxAge {
			continue
		}
		if live[name] && (r.awaiting.IsZero() || now.Sub(r.awaiting) <= maxAge) {
			continue
		}
		gone = append(gone, name)
		delete(x.reps, name)
	}
	slices.Sort(gone)
	return gone
}

// Computed returns how many blocks the replicas have stored in their GPU
// caches that the storing replica did not hold there before (a block
// keyed by tokens counts per tokenize.BlockSize tokens; a further copy of
// a held block does not count): the blocks the fleet has computed, as far
// as its events say, whoever routed the prompts. It only grows.
func (x *Index) Computed() uint64 { return x.computed.Load() }

// Publishes reports whether replica rep has an entry in the index: its
// events are arriving (or have not yet aged out), so its matches are
// precise and an empty match means it holds nothing.
func (x *Index) Publishes(rep string) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	_, ok := x.reps[rep]
	return ok
}

// PendingTTL is how long a block routed to a replica counts as held there
// before its BlockStored arrives: the engine reports a prompt's blocks only
// once it has computed them, and a second request for the same new prefix
// that arrives meanwhile should still find it there.
const PendingTTL = 10 * time.Second

// Expect records that a prompt's blocks were just routed to replica rep (a
// publishing one): until their BlockStored arrives, or PendingTTL after
// now, Match counts them as held in the GPU cache. Pending blocks share the
// replica's budget.
func (x *Index) Expect(rep string, blocks []uint64, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	r := x.reps[rep]
	if r == nil {
		return
	}
	if len(r.pending)+len(blocks) > x.budget/4 && now.Sub(r.pendingSwept) >= sweepEvery {
		r.pendingSwept = now
		for h, until := range r.pending {
			if !now.Before(until) {
				delete(r.pending, h)
			}
		}
	}
	r.risk.routed(blocks, now, x.budget/4)
	until := now.Add(PendingTTL)
	for _, h := range blocks {
		if _, ok := r.blocks[h]; ok {
			continue
		}
		if r.awaiting.IsZero() {
			r.awaiting = now
		}
		if len(r.pending) >= x.budget/4 {
			return
		}
		r.pending[h] = until
	}
}

// Match returns how many leading blocks of a prompt replica rep holds at
// now: gpu in its GPU cache (or routed there and not yet reported, see
// Expect), held in any medium (GPU or offloaded). Hashes are chained, so
// the match stops at the first block missing.
func (x *Index) Match(rep string, blocks []uint64, now time.Time) (gpu, held int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.reps[rep]
	if r == nil {
		return 0, 0
	}
	gpuOpen := true
	for _, h := range blocks {
		m, ok := r.blocks[h]
		if !ok {
			if until, p := r.pending[h]; p && now.Before(until) {
				ok, m = true, onGPU
			}
		}
		if !ok {
			break
		}
		held++
		if gpuOpen && m&onGPU != 0 {
			gpu++
		} else {
			gpuOpen = false
		}
	}
	return gpu, held
}

// Stats is one replica's share of the index, for metrics and the admin API.
type Stats struct {
	Blocks  int    // blocks held, any medium
	Events  uint64 // events applied
	Refused uint64 // stored blocks refused for the budget
	// Unkeyed counts stored blocks that could not be keyed by their
	// tokens (SetKeyByTokens): an unknown parent, a LoRA adapter, a block
	// size that is not a multiple of tokenize.BlockSize.
	Unkeyed uint64
	Last    time.Time
}

// Stats returns replica rep's figures, and false if it has no entry.
func (x *Index) Stats(rep string) (Stats, bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	r := x.reps[rep]
	if r == nil {
		return Stats{}, false
	}
	return Stats{Blocks: len(r.blocks), Events: r.events, Refused: r.refused, Unkeyed: r.unkeyed, Last: r.last}, true
}
