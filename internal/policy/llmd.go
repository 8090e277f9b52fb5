package policy

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// NameLLMD is the llm-d scheduler baseline's name.
const NameLLMD = "llm-d"

// LLMDConfig holds the settings of llm-d's default scheduling profile (the
// Gateway API Inference Extension's endpoint picker with no configuration,
// and llm-d's "inference scheduling" guide): three scorers, each score in
// [0, 1], summed with weights, the highest sum wins (docs/POLICIES.md).
type LLMDConfig struct {
	// QueueWeight weighs queue-scorer: (max waiting - waiting) / (max - min)
	// over the candidates, 1 for all when their queues are equal (2).
	QueueWeight float64
	// KVCacheWeight weighs kv-cache-utilization-scorer: 1 - KV usage (2).
	KVCacheWeight float64
	// PrefixWeight weighs prefix-cache-scorer: the share of the prompt's
	// blocks the replica holds in the scorer's approximate index (3).
	PrefixWeight float64
	// MaxPrefixBlocks is how many leading blocks of a prompt the prefix
	// scorer hashes (maxPrefixBlocksToMatch, 256).
	MaxPrefixBlocks int
	// LRUCapacityPerServer is the blocks each replica's index holds
	// (lruCapacityPerServer); 0 sizes it, as autoTune does, from the
	// replica's vllm:cache_config_info (num_gpu_blocks), and 31,250 until
	// that is known (0).
	LRUCapacityPerServer int
	// RefreshInterval is how often the original polls every replica's
	// /metrics (--refresh-metrics-interval, 50ms). llmlb bench scrapes at
	// this interval in this policy's runs; serve scrapes at scrape.interval.
	RefreshInterval time.Duration
}

// llmdDefaultLRUCapacity is the GIE prefix scorer's lruCapacityPerServer.
const llmdDefaultLRUCapacity = 31_250

// DefaultLLMDConfig returns llm-d's defaults.
func DefaultLLMDConfig() LLMDConfig {
	return LLMDConfig{QueueWeight: 2, KVCacheWeight: 2, PrefixWeight: 3, MaxPrefixBlocks: 256,
		RefreshInterval: 50 * time.Millisecond}
}

// Validate reports every invalid setting, naming its key.
func (c LLMDConfig) Validate() error {
	var bad []string
	for _, w := range []struct {
		key string
		v   float64
	}{{"queue_weight", c.QueueWeight}, {"kv_cache_weight", c.KVCacheWeight}, {"prefix_weight", c.PrefixWeight}} {
		if !(w.v >= 0) || math.IsInf(w.v, 0) {
			bad = append(bad, fmt.Sprintf("llmd.%s: must be >= 0, got %v", w.key, w.v))
		}
	}
	if c.MaxPrefixBlocks < 1 {
		bad = append(bad, fmt.Sprintf("llmd.max_prefix_blocks: must be >= 1, got %d", c.MaxPrefixBlocks))
	}
	if c.LRUCapacityPerServer < 0 {
		bad = append(bad, fmt.Sprintf("llmd.lru_capacity_per_server: must be >= 0, got %d", c.LRUCapacityPerServer))
	}
	if c.RefreshInterval <= 0 {
		bad = append(bad, fmt.Sprintf("llmd.refresh_interval: must be > 0, got %v", c.RefreshInterval))
	}
	if len(bad) > 0 {
		return errors.New(strings.Join(bad, "; "))
	}
	return nil
}

// LLMD is llm-d's default request scheduler, the endpoint picker of the
// Gateway API Inference Extension (GIE) as llm-d deploys it: no filters;
// queue-scorer, kv-cache-utilization-scorer and prefix-cache-scorer summed
// with weights 2, 2 and 3; max-score-picker, at random among equal sums.
// The prefix scorer keeps, per replica, an LRU of the block hashes of the
// prompts sent there (recorded when the replica is picked, never removed
// when a request ends). Read from kubernetes-sigs/gateway-api-inference-
// extension (pkg/epp/scheduling, pkg/epp/config/loader/defaults.go) and
// llm-d/llm-d's guides; docs/POLICIES.md lists what differs.
type LLMD struct {
	Base
	cfg LLMDConfig
	rng *rand.Rand

	ids     map[string]int32 // replica name -> server id
	servers []*llmdLRU       // by server id
	holders map[uint64][]int32

	explain bool

	// Scratch reused by Choose (it runs under the balancer's lock).
	keys    []uint64
	matched []int32 // by server id
	candID  []int32 // candidate index -> server id
	scores  []llmdScore
	ties    []int
}

// llmdScore is one candidate's scorers and their weighted sum.
type llmdScore struct{ queue, kv, prefix, sum float64 }

// NewLLMD returns the llm-d baseline, or an error for a bad config. Its
// random tie-break is seeded so that a benchmark run is deterministic.
func NewLLMD(cfg LLMDConfig) (*LLMD, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &LLMD{cfg: cfg, rng: rand.New(rand.NewPCG(0x11d, 0x5c0e)), ids: make(map[string]int32),
		holders: make(map[uint64][]int32)}, nil
}

// SetExplain turns per-candidate scores in Choice.Detail on or off.
func (p *LLMD) SetExplain(on bool) { p.explain = on }

// Name returns "llm-d".
func (p *LLMD) Name() string { return NameLLMD }

// SetSettings replaces the weights and sizes, keeping the index (a
// configuration reload).
func (p *LLMD) SetSettings(s Settings) error {
	if err := s.LLMD.Validate(); err != nil {
		return err
	}
	p.cfg = s.LLMD
	return nil
}

// RemoveReplica drops a replica's share of the index (the original purges
// pods that left every two minutes).
func (p *LLMD) RemoveReplica(name string) {
	id, ok := p.ids[name]
	if !ok {
		return
	}
	s := p.servers[id]
	for s.len() > 0 {
		p.unhold(s.evictOldest(), id)
	}
}

// Choose scores every candidate and picks the highest weighted sum.
func (p *LLMD) Choose(r *Request, cands []Candidate, _ time.Time) Choice {
	p.hashPrompt(r)
	p.candID = p.candID[:0]
	for i := range cands {
		p.candID = append(p.candID, p.server(cands[i].Name, cands[i].KVCacheTokens))
	}
	p.match()

	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for i := range cands {
		minQ, maxQ = min(minQ, cands[i].ScrapedWaiting), max(maxQ, cands[i].ScrapedWaiting)
	}
	p.scores = p.scores[:0]
	best := math.Inf(-1)
	for i := range cands {
		c := &cands[i]
		queue := 1.0
		if maxQ > minQ {
			queue = (maxQ - c.ScrapedWaiting) / (maxQ - minQ)
		}
		sc := llmdScore{queue: unit(queue), kv: unit(1 - c.KVCacheUsage)}
		if len(p.keys) > 0 {
			sc.prefix = unit(float64(p.matched[p.candID[i]]) / float64(len(p.keys)))
		}
		sc.sum = p.cfg.QueueWeight*sc.queue + p.cfg.KVCacheWeight*sc.kv + p.cfg.PrefixWeight*sc.prefix
		p.scores = append(p.scores, sc)
		best = max(best, sc.sum)
	}
	p.ties = p.ties[:0]
	for i, sc := range p.scores {
		if sc.sum == best {
			p.ties = append(p.ties, i)
		}
	}
	pick := 0
	if len(p.ties) == 1 {
		pick = p.ties[0]
	} else if len(p.ties) > 1 {
		pick = p.ties[p.rng.IntN(len(p.ties))]
	}
	id := p.candID[pick]
	matched := int(p.matched[id])
	for _, k := range p.keys { // PreRequest: the chosen pod learns every block
		p.add(id, k)
	}
	choice := Choice{Index: pick, Reason: ReasonLoad, Detail: "highest weighted score", Rule: "highest weighted score"}
	if matched > 0 {
		choice.Reason = ReasonAffinity
	}
	if p.explain {
		choice.Detail = p.detail(cands, len(p.ties))
	}
	return choice
}

// detail lists every candidate's scores for the debug log and decision
// records (SetExplain).
func (p *LLMD) detail(cands []Candidate, ties int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "highest weighted score, %d equal at the top", ties)
	for i, sc := range p.scores {
		fmt.Fprintf(&b, "; %s score=%.3f queue=%.3f kv=%.3f prefix=%.3f (%d of %d blocks) waiting=%.0f kv_usage=%.3f",
			cands[i].Name, sc.sum, sc.queue, sc.kv, sc.prefix, p.matched[p.candID[i]], len(p.keys), cands[i].ScrapedWaiting, cands[i].KVCacheUsage)
	}
	return b.String()
}

// unit clamps a score into [0, 1], as the framework does to every scorer's;
// NaN (a replica exporting NaN, or infinite queues) scores 0.
func unit(x float64) float64 {
	if !(x >= 0) {
		return 0
	}
	return min(1, x)
}

// hashPrompt keeps the prompt's first MaxPrefixBlocks block hashes in
// p.keys, mixed with the model name (the original seeds its hash chain with
// it, so models never share blocks).
func (p *LLMD) hashPrompt(r *Request) {
	p.keys = p.keys[:0]
	if r == nil {
		return
	}
	blocks := r.PromptBlocks[:min(len(r.PromptBlocks), p.cfg.MaxPrefixBlocks)]
	seed := fnvString(fnvOffset, r.Model)
	for _, b := range blocks {
		p.keys = append(p.keys, b^seed)
	}
}

// match counts, per server, the prompt's blocks it holds, walking the
// blocks in order and stopping at the first that no server holds (the
// original's matchLongestPrefix: a server is counted for every block of
// that run it holds, not only for an unbroken prefix of its own).
func (p *LLMD) match() {
	for len(p.matched) < len(p.servers) {
		p.matched = append(p.matched, 0)
	}
	clear(p.matched)
	for _, k := range p.keys {
		hs := p.holders[k]
		if len(hs) == 0 {
			return
		}
		for _, id := range hs {
			p.matched[id]++
		}
	}
}

// server returns the id of the named replica's index, sizing it from its
// KV capacity (autoTune) unless the capacity is configured.
func (p *LLMD) server(name string, kvTokens int) int32 {
	id, ok := p.ids[name]
	if !ok {
		id = int32(len(p.servers))
		p.ids[name] = id
		p.servers = append(p.servers, newLLMDLRU())
	}
	capacity := p.cfg.LRUCapacityPerServer
	if capacity == 0 {
		capacity = llmdDefaultLRUCapacity
		if kvTokens > 0 {
			capacity = max(1, kvTokens/tokenize.BlockSize)
		}
	}
	s := p.servers[id]
	s.capacity = capacity
	for s.len() > s.capacity {
		p.unhold(s.evictOldest(), id)
	}
	return id
}

// add makes k the most recent block of server id, evicting its oldest when
// full (hashicorp/golang-lru's Add).
func (p *LLMD) add(id int32, k uint64) {
	s := p.servers[id]
	if s.touch(k) {
		return
	}
	if s.len() >= s.capacity {
		p.unhold(s.evictOldest(), id)
	}
	s.push(k)
	p.holders[k] = append(p.holders[k], id)
}

// unhold removes server id from block k's holders.
func (p *LLMD) unhold(k uint64, id int32) {
	hs := p.holders[k]
	for i, h := range hs {
		if h == id {
			hs[i] = hs[len(hs)-1]
			hs = hs[:len(hs)-1]
			break
		}
	}
	if len(hs) == 0 {
		delete(p.holders, k)
	} else {
		p.holders[k] = hs
	}
}

// llmdLRU is one server's block hashes in recency order: a doubly linked
// list over a slice, newest at head.
type llmdLRU struct {
	capacity   int
	at         map[uint64]int32
	nodes      []llmdNode
	head, tail int32 // -1 when empty
	free       []int32
}

type llmdNode struct {
	key        uint64
	prev, next int32
}

func newLLMDLRU() *llmdLRU {
	return &llmdLRU{at: make(map[uint64]int32), head: -1, tail: -1}
}

func (l *llmdLRU) len() int { return len(l.at) }

// touch moves k to the head and reports whether it was there.
func (l *llmdLRU) touch(k uint64) bool {
	i, ok := l.at[k]
	if !ok {
		return false
	}
	if i != l.head {
		l.unlink(i)
		l.linkHead(i)
	}
	return true
}

// push adds k at the head (k is not in the list).
func (l *llmdLRU) push(k uint64) {
	var i int32
	if n := len(l.free); n > 0 {
		i, l.free = l.free[n-1], l.free[:n-1]
		l.nodes[i] = llmdNode{key: k}
	} else {
		i = int32(len(l.nodes))
		l.nodes = append(l.nodes, llmdNode{key: k})
	}
	l.at[k] = i
	l.linkHead(i)
}

// evictOldest removes and returns the tail's key (the list is not empty).
func (l *llmdLRU) evictOldest() uint64 {
	i := l.tail
	k := l.nodes[i].key
	l.unlink(i)
	delete(l.at, k)
	l.free = append(l.free, i)
	return k
}

func (l *llmdLRU) unlink(i int32) {
	n := &l.nodes[i]
	if n.prev >= 0 {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
}

func (l *llmdLRU) linkHead(i int32) {
	n := &l.nodes[i]
	n.prev, n.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}
