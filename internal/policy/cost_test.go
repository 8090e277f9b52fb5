package policy

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/kvindex"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// costCands returns n idle, identical candidates with known rates.
func costCands(n int) []Candidate {
	cs := make([]Candidate, n)
	for i := range cs {
		cs[i] = Candidate{Name: string(rune('a' + i)), Live: true, KVCacheTokens: 1 << 20,
			PrefillRate: 10_000, DecodeStep: 0.02}
	}
	return cs
}

// prompt returns a request of n blocks whose first shared blocks come from
// root (equal roots and counts give equal leading hashes).
func costPrompt(root string, shared, own int, session string) *Request {
	keys := make([]uint64, 0, shared+own)
	for i := range shared {
		keys = append(keys, tokenize.KeyOfText(root+string(rune('A'+i))))
	}
	for i := range own {
		keys = append(keys, tokenize.KeyOfText(session+"/"+string(rune('a'+i))))
	}
	p := tokenize.FromBlockKeys(len(keys)*tokenize.BlockSize, keys)
	return &request.Profile{PromptTokens: p.Tokens, PromptBlocks: p.Blocks, SessionKey: session}
}

func newCost(t *testing.T, mutate func(*CostConfig)) *Cost {
	t.Helper()
	cfg := DefaultCostConfig()
	if mutate != nil {
		mutate(&cfg)
	}
	p, err := NewCost(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCostFollowsTheCache(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(4)
	first := p.Choose(costPrompt("sys", 100, 10, "s1"), cands, t0)
	if first.CachedTokens != 0 || first.Reason != ReasonLoad {
		t.Fatalf("cold start: %+v", first)
	}
	// The next turn (same 110 blocks and more) finds its blocks there.
	next := p.Choose(costPrompt("sys", 100, 12, "s1"), cands, t0)
	if next.Index != first.Index || next.Reason != ReasonAffinity {
		t.Fatalf("next turn went to %d (%s), want %d by affinity", next.Index, next.Reason, first.Index)
	}
	if want := 110 * tokenize.BlockSize; next.CachedTokens != want || next.PrefillTokens != 2*tokenize.BlockSize {
		t.Fatalf("cached %d prefill %d, want %d and %d", next.CachedTokens, next.PrefillTokens, want, 2*tokenize.BlockSize)
	}
}

func TestCostLeavesAQueueWorseThanTheSaving(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(2)
	first := p.Choose(costPrompt("sys", 20, 0, "s1"), cands, t0)
	// 320 cached tokens save 32 ms at 10K tokens/s; 10,000 tokens of prefill
	// still owed by the cached replica cost a second.
	cands[first.Index].PendingPrefill = 10_000
	cands[first.Index].PendingRequests = 1
	c := p.Choose(costPrompt("sys", 20, 2, "s2"), cands, t0)
	if c.Index == first.Index {
		t.Fatalf("followed the cache behind a 1 s queue: %+v", c)
	}
	// A small queue (under one decode step at this rate) does not move it.
	p = newCost(t, nil)
	cands = costCands(2)
	first = p.Choose(costPrompt("sys", 20, 0, "s1"), cands, t0)
	cands[first.Index].PendingPrefill = 100
	cands[first.Index].PendingRequests = 1
	c = p.Choose(costPrompt("sys", 20, 3, "s3"), cands, t0)
	if c.Index != first.Index {
		t.Fatalf("left the cache for a queue of 100 tokens: %+v", c)
	}
}

func TestCostBoundedLoad(t *testing.T) {
	p := newCost(t, func(c *CostConfig) { c.BoundedLoad, c.BoundedLoadSlack = 1.5, 2 })
	cands := costCands(4)
	// Everyone shares one prefix cached on a; a holds 20 in flight, the
	// others 2: a's limit is max(ceil(1.5*27/4), 2+2) = 11.
	first := p.Choose(costPrompt("shared", 50, 0, ""), cands, t0)
	for i := range cands {
		cands[i].InFlight = 2
	}
	cands[first.Index].InFlight = 20
	c := p.Choose(costPrompt("shared", 50, 1, ""), cands, t0)
	if c.Index == first.Index {
		t.Fatal("the bounded-load rule let a replica at 20 in flight take more while the others hold 2")
	}
	if !strings.Contains((&Cost{}).Name(), "cost") {
		t.Fatal("name")
	}
}

// TestCostBoundedLoadBindsAffinityOnly: the bound keeps a replica past its
// share from taking a request that follows its cache or that its full batch
// cannot admit, but not one it holds nothing of and can admit at once, when
// the others owe long prefills (longshort: short requests behind 100K-token
// prefills).
func TestCostBoundedLoadBindsAffinityOnly(t *testing.T) {
	setup := func() (*Cost, []Candidate, int) {
		p := newCost(t, func(c *CostConfig) { c.BoundedLoad, c.BoundedLoadSlack, c.MaxNumSeqs = 1.5, 2, 64 })
		cands := costCands(4)
		held := p.Choose(costPrompt("shared", 50, 0, ""), cands, t0).Index
		// The others each owe a 100K-token prefill (10 s at 10K tokens/s);
		// the free one runs 20 short requests: past max(ceil(1.5*27/4), 4) = 11.
		for i := range cands {
			cands[i].InFlight, cands[i].PendingPrefill, cands[i].PendingRequests = 2, 100_000, 1
		}
		free := (held + 1) % len(cands)
		cands[free].InFlight, cands[free].PendingPrefill, cands[free].PendingRequests = 20, 0, 0
		return p, cands, free
	}
	p, cands, free := setup()
	if c := p.Choose(costPrompt("other", 0, 4, "a"), cands, t0); c.Index != free {
		t.Errorf("a short prompt no replica holds went to %d (estimate %.2fs), not to the free replica %d past its share: %s",
			c.Index, c.Estimate, free, p.detail(cands, 11, 4*tokenize.BlockSize))
	}
	// The free replica holds this prompt's prefix: the bound applies.
	p, cands, free = setup()
	p.Choose(costPrompt("mine", 10, 0, ""), cands, t0) // learn where it goes
	cands[free].InFlight = 0
	held := p.Choose(costPrompt("mine", 10, 1, ""), cands, t0).Index
	cands[held].InFlight, cands[held].PendingPrefill = 20, 0
	for i := range cands {
		if i != held {
			cands[i].InFlight, cands[i].PendingPrefill = 2, 100_000
		}
	}
	if c := p.Choose(costPrompt("mine", 10, 2, ""), cands, t0); c.Index == held {
		t.Errorf("the bound let replica %d past its share take a prompt it holds", held)
	}
	// Its batch is full: the bound applies.
	p, cands, free = setup()
	cands[free].InFlight = 64
	for i := range cands {
		if i != free {
			cands[i].InFlight = 30
		}
	}
	if c := p.Choose(costPrompt("other", 0, 4, "b"), cands, t0); c.Index == free {
		t.Errorf("the bound let a replica with a full batch (64 of 64) past its share take a request")
	}
	// At twice the limit the bound binds whatever the estimate says: with
	// 2 in flight on each of the others and 24 on the free one, the limit is
	// max(ceil(1.5*31/4), 4) = 12, and a 25th request is past 2 x 12.
	p, cands, free = setup()
	cands[free].InFlight = 24
	if c := p.Choose(costPrompt("other", 0, 4, "c"), cands, t0); c.Index == free {
		t.Errorf("the bound let a replica at 24 in flight take a request while the others hold 2 (limit 12)")
	}
}

func TestCostSessionWithoutBlocks(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(3)
	r := &request.Profile{SessionKey: "s1", PromptTokens: 8000}
	first := p.Choose(r, cands, t0)
	r2 := &request.Profile{SessionKey: "s1", PromptTokens: 8500}
	next := p.Choose(r2, cands, t0)
	if next.Index != first.Index || next.CachedTokens != 8000 {
		t.Fatalf("a session without prompt blocks: %+v after %+v", next, first)
	}
}

func TestCostSpreadsIdenticalColdRequests(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(4)
	seen := map[int]int{}
	for i := range 8 {
		c := p.Choose(costPrompt("x", 0, 4, string(rune('a'+i))), cands, t0)
		cands[c.Index].InFlight++
		cands[c.Index].PendingPrefill += float64(c.PrefillTokens)
		cands[c.Index].PendingRequests++
		seen[c.Index]++
	}
	for i := range 4 {
		if seen[i] != 2 {
			t.Fatalf("8 cold requests on 4 idle replicas spread %v, want 2 each", seen)
		}
	}
}

func TestCostExplainsEveryCandidate(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(3)
	if c := p.Choose(costPrompt("x", 2, 0, ""), cands, t0); c.Detail != "" {
		t.Fatalf("detail without SetExplain: %q", c.Detail)
	}
	p.SetExplain(true)
	c := p.Choose(costPrompt("x", 2, 0, ""), cands, t0)
	for _, want := range []string{"a ttft=", "b ttft=", "c ttft=", "limit=", "held_up=", "kv_held="} {
		if !strings.Contains(c.Detail, want) {
			t.Fatalf("detail %q lacks %q", c.Detail, want)
		}
	}
}

func TestCostForgetsARestartedReplica(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(2)
	first := p.Choose(costPrompt("sys", 30, 0, ""), cands, t0)
	p.ForgetCache(cands[first.Index].Name)
	c := p.Choose(costPrompt("sys", 30, 1, ""), cands, t0)
	if c.CachedTokens != 0 {
		t.Fatalf("matched %d tokens on a replica that restarted", c.CachedTokens)
	}
}

func TestCostIndexSizedToCapacity(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(1)
	cands[0].KVCacheTokens = 10 * tokenize.BlockSize // 10 blocks
	p.Choose(costPrompt("a", 8, 0, ""), cands, t0)
	p.Choose(costPrompt("b", 8, 0, ""), cands, t0) // evicts most of a
	c := p.Choose(costPrompt("a", 8, 1, ""), cands, t0)
	if c.CachedTokens >= 8*tokenize.BlockSize {
		t.Fatalf("matched %d tokens of a prompt the 10-block cache had to evict", c.CachedTokens)
	}
}

func TestSettingsApply(t *testing.T) {
	s := DefaultSettings()
	name, params, err := ParseSpec("prefix-tree:cache_threshold=0.5,balance_abs=32,balance_rel=1.0001")
	if err != nil || name != NamePrefixTree {
		t.Fatal(name, err)
	}
	if err := s.Apply(name, params); err != nil {
		t.Fatal(err)
	}
	if s.PrefixTree.CacheThreshold != 0.5 || s.PrefixTree.BalanceAbsThreshold != 32 || s.PrefixTree.BalanceRelThreshold != 1.0001 {
		t.Fatalf("applied: %+v", s.PrefixTree)
	}
	for _, bad := range []string{"prefix-tree:cache_threshold=2", "prefix-tree:nope=1", "rr:x=1", "cost:decode_step=fast", "cost:eviction_weight=-1", "prefix-tree:cache_threshold"} {
		s := DefaultSettings()
		name, params, err := ParseSpec(bad)
		if err == nil {
			err = s.Apply(name, params)
		}
		if err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	got := SplitSpecs("rr, prefix-tree:cache_threshold=0.5,balance_abs=32,cost:tie_steps=0,bounded_load=3,llmlb")
	want := []string{"rr", "prefix-tree:cache_threshold=0.5,balance_abs=32", "cost:tie_steps=0,bounded_load=3", "llmlb"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("SplitSpecs = %q, want %q", got, want)
	}
}

// TestCostBoundsIndexWorkPerRequest: a prompt longer than any context is
// indexed up to maxIndexBlocks only (the work runs under the routing lock).
func TestCostBoundsIndexWorkPerRequest(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(1)
	cands[0].KVCacheTokens = 1 << 30
	c := p.Choose(costPrompt("huge", 20_000, 0, ""), cands, t0)
	if got := p.index.Len(0); got != maxIndexBlocks {
		t.Fatalf("indexed %d blocks of a 20,000-block prompt, want %d", got, maxIndexBlocks)
	}
	if c.PrefillTokens != 20_000*tokenize.BlockSize {
		t.Fatalf("prefill = %d, want the whole prompt", c.PrefillTokens)
	}
}

func TestCostFinishedRefreshesTheIndex(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(1)
	cands[0].KVCacheTokens = 20 * tokenize.BlockSize // 20 blocks
	long := costPrompt("long", 8, 0, "")
	p.Choose(long, cands, t0)                          // a long request starts
	p.Choose(costPrompt("short", 8, 0, ""), cands, t0) // a short one starts and finishes
	// The long one finishes last: vLLM frees its blocks now, so they are the
	// freshest and the next new prompt evicts the short one's instead.
	p.Finished(cands[0].Name, long.PromptBlocks, t0)
	p.Choose(costPrompt("next", 8, 0, ""), cands, t0)
	if c := p.Choose(costPrompt("long", 8, 1, ""), cands, t0); c.CachedTokens != 8*tokenize.BlockSize {
		t.Fatalf("the prompt that finished last matched %d tokens, want all 8 blocks", c.CachedTokens)
	}
	if c := p.Choose(costPrompt("short", 8, 1, ""), cands, t0); c.CachedTokens >= 8*tokenize.BlockSize {
		t.Fatalf("the prompt that finished first matched %d tokens; its blocks were the least recently freed", c.CachedTokens)
	}
	p.Finished("unknown", long.PromptBlocks, t0) // a replica it never routed to: ignored
}

// TestCostPricesCopiesOntoFullCaches: when every cache is full and evicted
// blocks are asked for again, computing a cached prefix a second time
// elsewhere costs the blocks it evicts there; eviction_weight sets how much.
// At 0 the request leaves a short queue for an idle replica; at the default
// it stays with its cache.
func TestCostPricesCopiesOntoFullCaches(t *testing.T) {
	choose := func(weight float64) (stay bool) {
		p := newCost(t, func(c *CostConfig) { c.EvictionWeight = weight })
		cands := costCands(2)
		for i := range cands {
			cands[i].KVCacheTokens = 64 * tokenize.BlockSize
		}
		// Families of 24 blocks, more than both caches hold, come back:
		// the caches fill and evicted blocks are asked for again.
		for round := range 3 {
			for f := range 8 {
				p.Choose(costPrompt("fam"+string(rune('a'+f)), 24, 0, ""), cands, t0)
			}
			_ = round
		}
		if p.index.Reuse() <= 0 {
			t.Fatal("setup: no evicted block was asked for again")
		}
		hot := p.Choose(costPrompt("hot", 24, 0, ""), cands, t0)
		// The replica with the prefix owes 2,000 tokens of prefill (0.2 s);
		// the other would compute the 26-block prompt (42 ms) and evict 26
		// blocks for it.
		cands[hot.Index].PendingPrefill = 2000
		cands[hot.Index].PendingRequests = 1
		c := p.Choose(costPrompt("hot", 24, 2, "s"), cands, t0)
		return c.Index == hot.Index
	}
	if choose(0) {
		t.Fatal("eviction_weight 0: stayed behind a 0.2 s queue to save 42 ms of prefill")
	}
	if !choose(DefaultCostConfig().EvictionWeight) {
		t.Fatal("default eviction_weight: copied a cached prefix onto a full cache to save 0.2 s")
	}
}

// TestCostKeepsAPrefixInPlaceWhenRequestsArriveFast: computing a prompt
// again on an idle replica, rather than queueing it where its prefix is
// cached, wins this request's TTFT; but the prefill then delays whoever
// reaches that replica during it. Requests arriving far apart take the
// faster replica; arriving fast, the prompt stays with its prefix. The
// requests it holds up count at most once: behind a 10 s queue it leaves
// however fast they come.
func TestCostKeepsAPrefixInPlaceWhenRequestsArriveFast(t *testing.T) {
	route := func(gap time.Duration, queue float64) (held, chosen int) {
		p := newCost(t, nil)
		cands := costCands(2)
		now := t0
		held = p.Choose(costPrompt("sys", 200, 0, "s1"), cands, now).Index
		// The holder owes 5,000 tokens of prefill (0.5 s); the prefix saves
		// 3,200 (0.32 s): the idle replica is about 0.2 s sooner.
		cands[held].PendingPrefill, cands[held].PendingRequests = queue, 1
		for i := range 100 { // other traffic sets the rate
			now = now.Add(gap)
			p.Choose(costPrompt(fmt.Sprintf("other%d", i), 1, 0, ""), cands, now)
		}
		now = now.Add(gap)
		return held, p.Choose(costPrompt("sys", 200, 2, "s2"), cands, now).Index
	}
	if held, chosen := route(100*time.Second, 5_000); chosen == held {
		t.Errorf("one request every 100 s: stayed behind the 0.5 s queue on the holder")
	}
	if held, chosen := route(10*time.Millisecond, 5_000); chosen != held {
		t.Errorf("100 requests a second: computed the 3,200-token prefix again on the idle replica")
	}
	if held, chosen := route(time.Millisecond, 100_000); chosen == held {
		t.Errorf("1,000 requests a second: stayed behind a 10 s queue to save 0.32 s")
	}
}

// A replica whose KV the balancer's running requests fill admits a new
// prompt only as they end: an otherwise equal replica with room wins, though
// it has more requests in flight (the tie-break that would pick the other).
func TestCostWaitsForKVRoom(t *testing.T) {
	for _, tc := range []struct {
		name string
		held float64 // prompt tokens the first replica's requests hold
		want int
	}{
		{"room for the prompt", 40_000, 0},
		{"KV held by running requests", 95_000, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(2)
			for i := range cands {
				cands[i].KVCacheTokens, cands[i].MeanOutput = 100_000, 200
			}
			cands[0].InFlight, cands[0].HeldPrefill = 2, tc.held
			cands[1].InFlight = 3
			c := p.Choose(costPrompt("p", 600, 0, ""), cands, t0) // 9,600 tokens
			if c.Index != tc.want {
				t.Fatalf("chose %d, want %d: %+v", c.Index, tc.want, c)
			}
		})
	}
}

// The rate that keeps a prompt with its prefix is that of the requests its
// replicas could take: a flood for a model served elsewhere does not count.
func TestCostArrivalsAreCountedPerReplica(t *testing.T) {
	p := newCost(t, nil)
	fleet := costCands(4)
	ours, theirs := fleet[:2], fleet[2:] // two models on disjoint replicas
	now := t0
	held := p.Choose(costPrompt("sys", 200, 0, "s1"), ours, now).Index
	ours[held].PendingPrefill, ours[held].PendingRequests = 5_000, 1
	for i := range 100 { // our model: one request every 100 s
		now = now.Add(100 * time.Second)
		p.Choose(costPrompt(fmt.Sprintf("ours%d", i), 1, 0, ""), ours, now)
		for k := range 999 { // the other model: 10 a second in between
			p.Choose(costPrompt(fmt.Sprintf("theirs%d", k%50), 1, 0, ""), theirs, now.Add(time.Duration(k+1)*100*time.Millisecond))
		}
	}
	now = now.Add(100 * time.Second)
	if c := p.Choose(costPrompt("sys", 200, 2, "s2"), ours, now); c.Index == held {
		t.Errorf("another model's 10 requests a second kept the prompt behind a 0.5 s queue: %+v", c)
	}
}

// TestCostRotationStart: rotation_start changes only which of equal
// candidates is met first.
func TestCostRotationStart(t *testing.T) {
	for start := range 5 {
		p := newCost(t, func(c *CostConfig) { c.RotationStart = start })
		if got := p.Choose(costPrompt("x", 0, 4, "s"), costCands(4), t0).Index; got != start%4 {
			t.Errorf("rotation_start %d: the first of 4 equal candidates chosen is %d, want %d", start, got, start%4)
		}
	}
	if err := (CostConfig{RotationStart: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "cost.rotation_start") {
		t.Errorf("rotation_start -1: %v", err)
	}
}

// sessionPrompt returns a request of session "s": the first context blocks
// of the session's context (equal for equal counts), then own blocks of its
// own named by tag.
func sessionPrompt(context, own int, tag string) *Request {
	keys := make([]uint64, 0, context+own)
	for i := range context {
		keys = append(keys, tokenize.KeyOfText(fmt.Sprint("context/", i)))
	}
	for i := range own {
		keys = append(keys, tokenize.KeyOfText(fmt.Sprint(tag, "/", i)))
	}
	p := tokenize.FromBlockKeys(len(keys)*tokenize.BlockSize, keys)
	return &request.Profile{PromptTokens: p.Tokens, PromptBlocks: p.Blocks, SessionKey: "s"}
}

// TestCostSpreadsBursts: the later requests of a session's burst leave the
// burst's replica once the burst's own earlier requests have added more to
// their wait there than going elsewhere costs, well before their estimate
// alone would send them; requests that are not a burst are not moved.
func TestCostSpreadsBursts(t *testing.T) {
	// The session's context, 256 blocks, is held by one replica; its next
	// turn adds 32 blocks and comes as a burst whose requests each add 8
	// of their own (parallel tool calls).
	prompt := sessionPrompt
	// firstMoved returns the index of the burst's first request routed
	// away from the session's replica, requests gap apart, or -1.
	firstMoved := func(spread float64, gap time.Duration) (int, string) {
		p := newCost(t, func(c *CostConfig) { c.BurstSpread = spread })
		p.SetExplain(true)
		cands := costCands(2)
		home := p.Choose(prompt(256, 0, ""), cands, t0).Index // the previous turn, long done
		at := t0.Add(time.Minute)
		for k := range 40 {
			own := 8
			if k == 0 {
				own = 0
			}
			c := p.Choose(prompt(288, own, fmt.Sprint(k)), cands, at)
			if c.Index != home {
				return k, c.Detail
			}
			cands[home].PendingPrefill += float64(c.PrefillTokens)
			cands[home].PendingRequests++
			cands[home].InFlight++
			at = at.Add(gap)
		}
		return -1, ""
	}
	plain, _ := firstMoved(0, 0)
	spread, detail := firstMoved(1, 0)
	if plain < 0 {
		t.Fatal("with burst_spread 0 the burst never left its replica in 40 requests")
	}
	if spread < 2 || spread >= plain {
		t.Errorf("the burst's first request to leave its replica is #%d with burst_spread 1, #%d with 0: want it later than the second and earlier than with 0", spread, plain)
	}
	if !strings.Contains(detail, "burst_spread: from") {
		t.Errorf("the moved request's detail does not say it was spread: %q", detail)
	}
	// The same requests 2 s apart, each after the one before has its
	// first token: no burst, nothing spread.
	apartPlain, _ := firstMoved(0, 2*time.Second)
	apartSpread, _ := firstMoved(1, 2*time.Second)
	if apartSpread != apartPlain {
		t.Errorf("requests 2 s apart left the session's replica at #%d with burst_spread 1 and #%d with 0: only bursts are spread", apartSpread, apartPlain)
	}
	// Work other sessions queue on the burst's replica is not the burst's:
	// with 2 s of it ahead and a copy elsewhere of 3.3 s, the sibling stays.
	p := newCost(t, nil)
	cands := costCands(2)
	home := p.Choose(prompt(2048, 0, ""), cands, t0).Index
	at := t0.Add(time.Minute)
	first := p.Choose(prompt(2080, 0, "0"), cands, at)
	if first.Index != home {
		t.Fatalf("setup: the burst's first request left the session's replica")
	}
	cands[home].PendingPrefill += float64(first.PrefillTokens) + 20_000
	cands[home].PendingRequests += 2
	cands[home].InFlight += 2
	if c := p.Choose(prompt(2080, 8, "1"), cands, at); c.Index != home {
		t.Errorf("a burst's second request left its cache for a 3.3 s copy because of 2 s of other sessions' prefill: %s", c.Detail)
	}
	if err := (CostConfig{BurstSpread: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "cost.burst_spread") {
		t.Errorf("burst_spread -1: %v", err)
	}
}

func TestBurstWindowIsBounded(t *testing.T) {
	for _, c := range []struct {
		ttft float64
		want int64
	}{
		{0.25, int64(250 * time.Millisecond)},
		{-1, 0},
		{math.NaN(), 0},
		{math.Inf(1), int64(maxBurstWindow)},
		{1e300, int64(maxBurstWindow)},
	} {
		if got := burstWindow(c.ttft); got != c.want {
			t.Errorf("burstWindow(%v) = %d, want %d", c.ttft, got, c.want)
		}
	}
}

// TestCostBurstSharesTheCopysEvictions: on full caches, a copy of a
// session's context elsewhere is priced by the blocks it evicts; a burst's
// later requests follow the copy, so the price is shared among those the
// burst is expected to send (its previous burst's size, less those sent),
// and a burst leaves a replica with seconds of prefill queued where a
// session whose requests came one at a time keeps its request with its
// cache. Without the sharing both stay.
func TestCostBurstSharesTheCopysEvictions(t *testing.T) {
	prompt := func(own int, tag string) *Request { return sessionPrompt(24, own, tag) }
	// moved reports whether the second request of a burst left the
	// session's replica, after six earlier requests gap apart (0: a burst).
	moved := func(gap time.Duration) bool {
		p := newCost(t, nil)
		cands := costCands(2)
		for i := range cands {
			cands[i].KVCacheTokens = 64 * tokenize.BlockSize
		}
		// Families of 24 blocks, more than both caches hold, come back:
		// the caches fill and evicted blocks are asked for again.
		for range 3 {
			for f := range 8 {
				p.Choose(costPrompt("fam"+string(rune('a'+f)), 24, 0, ""), cands, t0)
			}
		}
		reuse := p.index.Reuse()
		if reuse <= 0 {
			t.Fatal("setup: no evicted block was asked for again")
		}
		at := t0
		var home int
		for k := range 6 {
			home = p.Choose(prompt(1, fmt.Sprint("earlier", k)), cands, at).Index
			at = at.Add(gap)
		}
		// The next burst, a minute later: the session's replica now owes
		// prefill that takes about 0.6 of what a copy of the 26-block
		// prompt on the other replica is priced at for its evictions.
		price := DefaultCostConfig().EvictionWeight * reuse * 26 * tokenize.BlockSize / 10_000
		cands[home].PendingPrefill = 0.6 * price / (1/10_000.0 + 0.02/2048)
		cands[home].PendingRequests = 1
		at = at.Add(time.Minute)
		first := p.Choose(prompt(2, "first"), cands, at)
		if first.Index != home {
			t.Fatalf("setup: the burst's first request left the session's replica (owing %.0f tokens; copy priced %.2fs)", cands[home].PendingPrefill, price)
		}
		cands[home].PendingPrefill += float64(first.PrefillTokens)
		cands[home].PendingRequests++
		cands[home].InFlight++
		return p.Choose(prompt(2, "second"), cands, at).Index != home
	}
	if !moved(0) {
		t.Error("after a burst of 6, the next burst's second request stayed behind seconds of prefill to spare one copy's evictions")
	}
	if moved(10 * time.Second) {
		t.Error("after requests one at a time, the second request of two left its cache for a full one")
	}
}

// TestRecordedTokenRoundTrips: Choice.Recorded carries a Touch and the
// blocks held before it, at their extremes, back to Refused unchanged.
func TestRecordedTokenRoundTrips(t *testing.T) {
	for _, c := range []struct {
		t    kvindex.Touched
		held int
	}{
		{kvindex.Touched{Stamp: 1}, 0},
		{kvindex.Touched{Stamp: math.MaxUint32, Evicted: maxIndexBlocks}, maxIndexBlocks},
		{kvindex.Touched{Stamp: 12345, Evicted: 77}, 4096},
	} {
		v := recordedToken(c.t, c.held)
		if v == 0 {
			t.Fatalf("%+v: token 0 means nothing recorded", c)
		}
		if gotT, gotHeld := recordedTouch(v); gotT != c.t || gotHeld != c.held {
			t.Errorf("%+v held %d: round trip gave %+v held %d", c.t, c.held, gotT, gotHeld)
		}
	}
}

// TestCostCopiesAHotPrefix: a prefix whose requests overlap (more in
// flight at once than the replicas holding it) is copied onto a replica
// with fewer requests in flight, its prefill priced for the requests the
// copy will serve; a prefix whose requests come one at a time stays where
// it is cached, and so does a hot one whose copy would not tie.
func TestCostCopiesAHotPrefix(t *testing.T) {
	// prompt is a request on the shared 125-block prefix (2,000 tokens)
	// with a suffix of its own and no session key.
	prompt := func(k int) *Request {
		keys := make([]uint64, 0, 126)
		for i := range 125 {
			keys = append(keys, tokenize.KeyOfText(fmt.Sprint("scenario/", i)))
		}
		keys = append(keys, tokenize.KeyOfText(fmt.Sprint("user/", k)))
		p := tokenize.FromBlockKeys(len(keys)*tokenize.BlockSize, keys)
		return &request.Profile{PromptTokens: p.Tokens, PromptBlocks: p.Blocks}
	}
	// firstCopy returns the first request, of 100 gap apart, that left the
	// replica holding the prefix (which has homeLoad more in flight), or -1.
	firstCopy := func(gap time.Duration, homeLoad, hotPrefixes int) int {
		p := newCost(t, func(c *CostConfig) { c.HotPrefixes = hotPrefixes })
		p.SetExplain(true)
		cands := costCands(2)
		for i := range cands {
			cands[i].MeanOutput = 200 // 4 s in flight at 20 ms a step
		}
		home := p.Choose(prompt(0), cands, t0).Index
		cands[home].InFlight = homeLoad
		at := t0
		for k := 1; k <= 100; k++ {
			at = at.Add(gap)
			if c := p.Choose(prompt(k), cands, at); c.Index != home {
				if c.PrefillTokens < 2000 {
					t.Fatalf("request %d copied %d tokens, want the prefix's 2,000 and more", k, c.PrefillTokens)
				}
				if !strings.Contains(c.Detail, cands[c.Index].Name+" ttft=") || !strings.Contains(c.Detail, "hot_copy_shared_by=") {
					t.Errorf("the copy's detail does not say its price was shared: %s", c.Detail)
				}
				return k
			}
		}
		return -1
	}
	// 20 requests a second, 4 s each: 80 in flight on one replica; the
	// copy's 0.4 s (prefill and the requests it holds up) shared by 40.
	if k := firstCopy(50*time.Millisecond, 3, 64); k < 0 {
		t.Error("a prefix with 80 requests in flight stayed on one replica with more in flight than the other")
	} else if k < 40 {
		// Shared by no more requests than have come: 0.4 s within the
		// 20 ms of a step only once 40 have, 20 for each of two holders.
		t.Errorf("request %d copied the prefix: its price was shared by more requests than had come", k)
	}
	// One a minute: never more than one in flight.
	if k := firstCopy(time.Minute, 3, 64); k >= 0 {
		t.Errorf("request %d copied a prefix whose requests come one at a time", k)
	}
	// Hot, but its replica no busier: the copy is no better there.
	if k := firstCopy(50*time.Millisecond, 0, 64); k >= 0 {
		t.Errorf("request %d copied a hot prefix away from a replica as free as the other", k)
	}
	// hot_prefixes 0: no copy is priced below its prefill.
	if k := firstCopy(50*time.Millisecond, 3, 0); k >= 0 {
		t.Errorf("request %d copied the prefix with hot_prefixes 0", k)
	}
	if err := (CostConfig{HotPrefixes: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "cost.hot_prefixes") {
		t.Errorf("hot_prefixes -1: %v", err)
	}
}

// TestCostHotPrefixTableIsBounded: a client sending ever new prefixes (each
// twice, so that the second matches the first's blocks) cannot grow the
// table of hot prefixes past hot_prefixes.
func TestCostHotPrefixTableIsBounded(t *testing.T) {
	p := newCost(t, func(c *CostConfig) { c.HotPrefixes = 8 })
	cands := costCands(3)
	at := t0
	for k := range 200 {
		for range 2 {
			at = at.Add(time.Millisecond)
			p.Choose(costPrompt(fmt.Sprint("tenant", k), 4, 1, ""), cands, at)
		}
		if len(p.hot) > 8 {
			t.Fatalf("after %d prefixes the table holds %d, want at most hot_prefixes 8", k+1, len(p.hot))
		}
	}
	if len(p.hot) == 0 {
		t.Fatal("no prefix was followed")
	}
}

// TestCostPricesMarginalReuse: between two full replicas alike in all else,
// the prompt of a session seen before that no replica holds (its context
// lost) goes to the one whose evicted blocks do not come back (its
// evictions cost no later hit), in either order of equal candidates; with
// margin_window 0, for a sessionless prompt or for a session's first, both
// orders take the other, whose least recently used block is older (the
// coldest cache wins a tie).
func TestCostPricesMarginalReuse(t *testing.T) {
	run := func(window float64, rotation int, session string, seen bool) (string, string) {
		p := newCost(t, func(c *CostConfig) { c.MarginWindow, c.RotationStart = window, rotation })
		cands := costCands(2)
		for i := range cands {
			cands[i].KVCacheTokens = 100 * tokenize.BlockSize
		}
		p.Choose(costPrompt("warm", 1, 0, ""), cands, t0) // maps a and b, sized to 100 blocks
		a, b := p.ids["a"], p.ids["b"]
		d := make([]int32, 2)
		ask := func(rep int32, h string) {
			blocks := []uint64{tokenize.KeyOfText(h)}
			p.index.Match(blocks, d)
			p.index.Touch(rep, blocks)
		}
		// a's working set is a fifth larger than its cache: what it evicts
		// comes back 20 evictions later. b's is three times its cache.
		for range 10 {
			for h := range 120 {
				ask(a, fmt.Sprint("a/", h))
			}
			for h := range 300 {
				ask(b, fmt.Sprint("b/", h))
			}
		}
		// Two prompts no replica holds, of the session (its own 10
		// blocks) or of none (10 blocks under a root of their own).
		prompt := func(k string) *Request {
			r := costPrompt(k, 10, 0, "")
			r.SessionKey = session
			return r
		}
		if seen { // its context is lost everywhere
			p.sessions[session] = costSession{rep: a}
		}
		c := p.Choose(prompt("new"), cands, t0)
		p.SetExplain(true)
		return cands[c.Index].Name, p.Choose(prompt("next"), cands, t0).Detail
	}
	for _, rotation := range []int{0, 1} {
		if got, detail := run(DefaultCostConfig().MarginWindow, rotation, "s1", true); got != "b" || !strings.Contains(detail, "marginal_reuse=") {
			t.Errorf("rotation_start %d: went to %s, want b, whose evicted blocks do not come back (detail %q)", rotation, got, detail)
		}
		if got, _ := run(0, rotation, "s1", true); got != "a" {
			t.Errorf("margin_window 0, rotation_start %d: went to %s, want a, the coldest cache", rotation, got)
		}
		if got, detail := run(DefaultCostConfig().MarginWindow, rotation, "", false); got != "a" || strings.Contains(detail, "marginal_reuse=") {
			t.Errorf("no session key, rotation_start %d: went to %s, want a, the coldest cache (detail %q)", rotation, got, detail)
		}
		if got, _ := run(DefaultCostConfig().MarginWindow, rotation, "s1", false); got != "a" {
			t.Errorf("a session's first request, rotation_start %d: went to %s, want a, the coldest cache", rotation, got)
		}
	}
	for _, bad := range []float64{-1, 0.001, 17, math.NaN()} {
		if err := (CostConfig{MarginWindow: bad}).Validate(); err == nil || !strings.Contains(err.Error(), "cost.margin_window") {
			t.Errorf("margin_window %v: %v", bad, err)
		}
	}
	for _, good := range []float64{0, 0.05, 16} {
		c := DefaultCostConfig()
		c.MarginWindow = good
		if err := c.Validate(); err != nil {
			t.Errorf("margin_window %v: %v", good, err)
		}
	}
}

// TestCostPricesTheDelayByQueueWithoutSharing: replica a has 31 of its 32
// slots' worth of requests in flight, 28 of them still waiting for a
// short prefill (0.2 s of work ahead); b has 4 in flight and 4 s of work
// ahead. A 2 s prompt no replica holds any of: on a fleet that shares no
// prefixes, the requests it delays are those reaching the replica while
// its queue and the prompt are worked off, and it goes where it starts
// first (a); on a fleet that shares prefixes, a's count still prices it
// at 32x its prefill there, and it goes to b.
func TestCostPricesTheDelayByQueueWithoutSharing(t *testing.T) {
	route := func(warm func(i int) *Request, decisions int) int {
		p := newCost(t, nil)
		cands := costCands(2)
		now := t0
		for i := range decisions { // one request a second sets the rate; 256 make a window of the cached share
			now = now.Add(time.Second)
			p.Choose(warm(i), cands, now)
		}
		cands[0].InFlight, cands[0].PendingRequests, cands[0].PendingPrefill, cands[0].MaxRunning = 31, 28, 2_000, 32
		cands[1].InFlight, cands[1].PendingRequests, cands[1].PendingPrefill, cands[1].MaxRunning = 4, 1, 40_000, 32
		return p.Choose(costPrompt("long", 0, 1250, "x"), cands, now.Add(time.Second)).Index
	}
	own := func(i int) *Request { return costPrompt(fmt.Sprint("own", i), 1, 0, "") }
	if got := route(own, 300); got != 0 {
		t.Errorf("no prefixes shared: the 2 s prompt went behind 4 s of work ahead, not 0.2 s")
	}
	if got := route(own, 100); got != 1 {
		t.Errorf("fewer decisions than a window: the rule engaged before the cached share was known")
	}
	if got := route(func(i int) *Request { return costPrompt("sys", 200, 1, fmt.Sprint("s", i)) }, 300); got != 1 {
		t.Errorf("prefixes shared: the 2 s prompt went to the replica with 31 of 32 slots' requests in flight")
	}
}
