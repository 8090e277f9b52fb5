package policy

import (
	"fmt"
	"time"
)

// PrefixTreeConfig holds the cache_aware settings of the SGLang router (and
// its vllm-project/router fork), with their current launcher defaults.
type PrefixTreeConfig struct {
	CacheThreshold      float64       // cache_threshold: minimum prefix match rate to follow the match (0.3)
	BalanceAbsThreshold int           // balance_abs_threshold: imbalanced if max-min load exceeds it (64)
	BalanceRelThreshold float64       // balance_rel_threshold: ... and max load exceeds rel*min (1.5)
	EvictionInterval    time.Duration // eviction_interval_secs: LRU eviction period, 0 disables (120s)
	MaxTreeBlocks       int           // max_tree_size in blocks per replica and model (2^20, see DefaultPrefixTreeConfig)
}

// DefaultPrefixTreeConfig returns SGLang's defaults. Its max_tree_size is
// 2^26 characters; we count 16-token blocks of ~4 characters a token, so
// the same budget is 2^26/64 = 2^20 blocks.
func DefaultPrefixTreeConfig() PrefixTreeConfig {
	return PrefixTreeConfig{
		CacheThreshold:      0.3,
		BalanceAbsThreshold: 64,
		BalanceRelThreshold: 1.5,
		EvictionInterval:    120 * time.Second,
		MaxTreeBlocks:       1 << 20,
	}
}

// Validate reports the first invalid setting, naming it.
func (c PrefixTreeConfig) Validate() error {
	switch {
	case c.CacheThreshold < 0 || c.CacheThreshold > 1 || c.CacheThreshold != c.CacheThreshold:
		return fmt.Errorf("policy: prefix-tree cache_threshold %v must be within [0, 1]", c.CacheThreshold)
	case c.BalanceAbsThreshold < 0:
		return fmt.Errorf("policy: prefix-tree balance_abs_threshold %d must not be negative", c.BalanceAbsThreshold)
	case c.BalanceRelThreshold < 0 || c.BalanceRelThreshold != c.BalanceRelThreshold:
		return fmt.Errorf("policy: prefix-tree balance_rel_threshold %v must not be negative", c.BalanceRelThreshold)
	case c.EvictionInterval < 0:
		return fmt.Errorf("policy: prefix-tree eviction_interval %v must not be negative", c.EvictionInterval)
	case c.MaxTreeBlocks <= 0:
		return fmt.Errorf("policy: prefix-tree max_tree_blocks %d must be positive", c.MaxTreeBlocks)
	}
	return nil
}

// PrefixTree is the SGLang router's cache_aware policy (docs/POLICIES.md): an
// approximate tree, per model, of the prompts each replica was sent. When
// the fleet is imbalanced (max-min in-flight > abs and max > rel*min) it
// routes to the least-loaded replica; otherwise to the replica with the
// longest prefix match if the match rate exceeds cache_threshold, else to
// the replica with the smallest tree. The chosen replica's tree learns the
// prompt either way. Prompts are matched on request.Profile.PromptBlocks
// (chained 16-token block hashes) instead of characters; docs/POLICIES.md
// lists every difference from the original.
type PrefixTree struct {
	Base
	cfg   PrefixTreeConfig
	trees map[string]*blockTree // by model

	ids   map[string]int32 // replica name -> tenant id, stable for the policy's life
	names []string         // tenant id -> replica name

	// Scratch buffers reused by Choose (the policy runs under the
	// balancer's lock, so one set suffices).
	candTenant []int32      // candidate index -> tenant id
	tenantCand []int32      // tenant id -> candidate index, or -1
	path       []*treeNode  // existing nodes along the prompt
	heap       evictionHeap // eviction work list

	lastEviction time.Time
	started      bool
}

// NewPrefixTree returns a prefix-tree policy, or an error for a bad config.
func NewPrefixTree(cfg PrefixTreeConfig) (*PrefixTree, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &PrefixTree{
		cfg:   cfg,
		trees: make(map[string]*blockTree),
		ids:   make(map[string]int32),
	}, nil
}

// Name returns "prefix-tree".
func (p *PrefixTree) Name() string { return NamePrefixTree }

// Choose runs cache_aware's selection and records the prompt in the chosen
// replica's tree. It also runs the periodic LRU eviction when due.
func (p *PrefixTree) Choose(r *Request, cands []Candidate, now time.Time) Choice {
	p.maybeEvict(now)
	p.mapCandidates(cands)
	defer p.unmapCandidates()

	var blocks []uint64
	model := ""
	if r != nil {
		blocks, model = r.PromptBlocks, r.Model
	}
	tree := p.tree(model)
	stamp := now.UnixNano()

	// Load balancing first: cache_aware checks imbalance before the tree.
	least, minLoad, maxLoad := 0, cands[0].InFlight, cands[0].InFlight
	for i, c := range cands {
		if c.InFlight < minLoad {
			least, minLoad = i, c.InFlight
		}
		maxLoad = max(maxLoad, c.InFlight)
	}
	if maxLoad-minLoad > p.cfg.BalanceAbsThreshold &&
		float64(maxLoad) > float64(minLoad)*p.cfg.BalanceRelThreshold {
		p.path = tree.walk(blocks, p.path[:0])
		tree.insert(blocks, p.path, p.candTenant[least], stamp)
		return Choice{Index: least, Reason: ReasonLoad, Detail: "imbalanced: least in-flight", Rule: "imbalanced: fewest in flight"}
	}

	// Cache-aware routing: the longest match among the candidates.
	p.path = tree.walk(blocks, p.path[:0])
	depth, matched := p.longestMatch(tree)
	rate := 0.0
	if len(blocks) > 0 {
		rate = float64(depth) / float64(len(blocks))
	}
	if matched >= 0 && rate > p.cfg.CacheThreshold {
		tree.insert(blocks, p.path, p.candTenant[matched], stamp) // also stamps the matched path
		return Choice{Index: matched, Reason: ReasonAffinity, Detail: "longest prefix match", Rule: "longest prefix match"}
	}
	smallest := 0
	for i := range cands {
		if tree.sizeOf(p.candTenant[i]) < tree.sizeOf(p.candTenant[smallest]) {
			smallest = i
		}
	}
	if matched >= 0 && matched != smallest {
		// SGLang's prefix_match stamps the tenant it found even when the
		// match is too short to follow.
		tree.touch(p.path[:depth], p.candTenant[matched], stamp)
	}
	tree.insert(blocks, p.path, p.candTenant[smallest], stamp)
	return Choice{Index: smallest, Reason: ReasonLoad, Detail: "match below threshold: smallest tree", Rule: "match below threshold: smallest tree"}
}

// SetSettings replaces prefix-tree's parameters, keeping its trees (a
// configuration reload).
func (p *PrefixTree) SetSettings(s Settings) error {
	if err := s.PrefixTree.Validate(); err != nil {
		return err
	}
	p.cfg = s.PrefixTree
	return nil
}

// RemoveReplica drops a replica's share of every tree (SGLang's
// remove_tenant), so a replica that returns starts cold.
func (p *PrefixTree) RemoveReplica(name string) {
	id, ok := p.ids[name]
	if !ok {
		return
	}
	for _, t := range p.trees {
		t.removeTenant(id)
	}
}

// longestMatch returns how many leading blocks of p.path some candidate
// holds and which candidate (the most recently used one at the deepest
// node), or -1 when no candidate holds the first block. A tenant on a node
// is on all its ancestors, so the first node without a candidate ends the
// match.
func (p *PrefixTree) longestMatch(t *blockTree) (depth, cand int) {
	cand = -1
	for d, n := range p.path {
		best, bestLast := -1, int64(0)
		for _, m := range n.marks {
			if c := p.tenantCand[m.id]; c >= 0 && (best < 0 || m.last > bestLast) {
				best, bestLast = int(c), m.last
			}
		}
		if best < 0 {
			break
		}
		depth, cand = d+1, best
	}
	return depth, cand
}

func (p *PrefixTree) tree(model string) *blockTree {
	t := p.trees[model]
	if t == nil {
		t = newBlockTree()
		p.trees[model] = t
	}
	return t
}

func (p *PrefixTree) tenant(name string) int32 {
	id, ok := p.ids[name]
	if !ok {
		id = int32(len(p.names))
		p.ids[name] = id
		p.names = append(p.names, name)
		p.tenantCand = append(p.tenantCand, -1)
	}
	return id
}

func (p *PrefixTree) mapCandidates(cands []Candidate) {
	p.candTenant = p.candTenant[:0]
	for i, c := range cands {
		id := p.tenant(c.Name)
		p.candTenant = append(p.candTenant, id)
		p.tenantCand[id] = int32(i)
	}
}

func (p *PrefixTree) unmapCandidates() {
	for _, id := range p.candTenant {
		p.tenantCand[id] = -1
	}
}

// maybeEvict runs the LRU eviction every EvictionInterval of the clock that
// drives Choose (SGLang runs it on a background thread; we have none).
func (p *PrefixTree) maybeEvict(now time.Time) {
	if !p.started {
		p.started, p.lastEviction = true, now
		return
	}
	if p.cfg.EvictionInterval <= 0 || now.Sub(p.lastEviction) < p.cfg.EvictionInterval {
		return
	}
	p.lastEviction = now
	for _, t := range p.trees {
		p.heap = t.evict(p.cfg.MaxTreeBlocks, p.heap[:0])
	}
}
