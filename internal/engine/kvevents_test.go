package engine

import (
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/kvevents"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// TestKVEventsFollowTheCache runs prompts through a tiny engine and checks
// that an index fed only its events holds exactly what its cache holds.
func TestKVEventsFollowTheCache(t *testing.T) {
	p, err := Lookup(DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	p.KVCacheTokens = 64 * tokenize.BlockSize
	e := New(p)
	e.RecordKVEvents(true)
	idx := kvevents.NewIndex(0)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var prompts []tokenize.Prompt
	for i := range 12 {
		prompts = append(prompts, tokenize.FromText(string(rune('a'+i))+string(make([]byte, 16*64*(1+i%3)))))
	}
	for i, pr := range prompts {
		if err := e.Add(Request{ID: uint64(i + 1), Prompt: pr, MaxTokens: 4}, now); err != nil {
			t.Fatal(err)
		}
		for {
			next, ok := e.NextEvent()
			if !ok {
				break
			}
			now = next
			e.Advance(now, func(Event) {})
		}
		idx.Apply("r", kvevents.Batch{Events: e.DrainKVEvents(nil)}, now)
	}
	for i, pr := range prompts {
		var hits []int32
		hits = e.kv.matchPrefix(pr.Blocks, hits)
		if gpu, _ := idx.Match("r", pr.Blocks, now); gpu != len(hits) {
			t.Errorf("prompt %d: events say %d blocks held, the cache holds %d", i, gpu, len(hits))
		}
	}
	if st, _ := idx.Stats("r"); st.Blocks == 0 || st.Blocks > 64 {
		t.Errorf("index holds %d blocks, want 1..64", st.Blocks)
	}
}

func TestResetPrefixCacheLogsAllBlocksCleared(t *testing.T) {
	p, err := Lookup(DefaultProfile)
	if err != nil {
		t.Fatal(err)
	}
	e := New(p)
	e.RecordKVEvents(true)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pr := tokenize.FromText(string(make([]byte, 64*8)))
	if err := e.Add(Request{ID: 1, Prompt: pr, MaxTokens: 2}, now); err != nil {
		t.Fatal(err)
	}
	if e.ResetPrefixCache() {
		t.Fatal("reset while a request holds blocks")
	}
	for {
		next, ok := e.NextEvent()
		if !ok {
			break
		}
		e.Advance(next, func(Event) {})
	}
	if !e.ResetPrefixCache() {
		t.Fatal("reset refused on an idle engine")
	}
	evs := e.DrainKVEvents(nil)
	if len(evs) != 1 || evs[0].Kind != kvevents.AllBlocksCleared {
		t.Fatalf("events after reset: %+v", evs)
	}
	if hits := e.kv.matchPrefix(pr.Blocks, nil); len(hits) != 0 {
		t.Fatalf("%d blocks still cached after reset", len(hits))
	}
}
