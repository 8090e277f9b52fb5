package simreplica

import (
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/kvevents"
	"github.com/llmlb/llmlb/internal/tokenize"
)

type idsTokenizer struct{}

func (idsTokenizer) ChatTokens([]tokenize.Message) ([]uint32, error) { return nil, nil }
func (idsTokenizer) PromptTokens(string) ([]uint32, error)           { return nil, nil }

func TestEngineTokensHashAndEvents(t *testing.T) {
	a := newEngineTokens(idsTokenizer{}, "")
	b := newEngineTokens(idsTokenizer{}, "")
	ids := make([]uint32, 3*tokenize.BlockSize+4)
	for i := range ids {
		ids[i] = uint32(i * 7)
	}
	pa, pb := a.prompt(ids), b.prompt(ids)
	if pa.Tokens != len(ids) || len(pa.Blocks) != 3 {
		t.Fatalf("prompt: %d tokens, %d blocks", pa.Tokens, len(pa.Blocks))
	}
	// Two engines seeded at random hash the same tokens apart, and
	// neither as llmlb does.
	if slices.Equal(pa.Blocks, pb.Blocks) || slices.Equal(pa.Blocks, tokenize.FromTokenIDs(ids).Blocks) {
		t.Fatalf("engine hashes are not private: %x %x", pa.Blocks, pb.Blocks)
	}
	if s1, s2 := newEngineTokens(idsTokenizer{}, "42").prompt(ids), newEngineTokens(idsTokenizer{}, "42").prompt(ids); !slices.Equal(s1.Blocks, s2.Blocks) {
		t.Fatal("a set seed does not give the same hashes")
	}
	other := a.prompt(ids[:2*tokenize.BlockSize+1]) // shares blocks 0-1
	if !slices.Equal(other.Blocks, pa.Blocks[:2]) {
		t.Fatalf("a shared prefix hashes apart: %x vs %x", other.Blocks, pa.Blocks)
	}

	// The engine logs blocks 1-2 of the prompt and then another prompt's
	// head in one run of stores: two events, the first naming its parent.
	head := a.prompt([]uint32{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9})
	evs := a.events([]kvevents.Event{
		{Kind: kvevents.BlockStored, BlockHashes: []uint64{pa.Blocks[1], pa.Blocks[2], head.Blocks[0]}, Medium: kvevents.MediumGPU},
		{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{pa.Blocks[0]}, Medium: kvevents.MediumGPU},
	})
	if len(evs) != 3 {
		t.Fatalf("%d events, want 3: %+v", len(evs), evs)
	}
	first, second := evs[0], evs[1]
	if !first.HasParent || first.Parent != pa.Blocks[0] || !slices.Equal(first.BlockHashes, pa.Blocks[1:3]) ||
		!slices.Equal(first.TokenIDs, ids[tokenize.BlockSize:3*tokenize.BlockSize]) || first.BlockSize != tokenize.BlockSize {
		t.Fatalf("first event %+v", first)
	}
	if second.HasParent || !slices.Equal(second.BlockHashes, head.Blocks) || !slices.Equal(second.TokenIDs, slices.Repeat([]uint32{9}, 16)) {
		t.Fatalf("second event %+v", second)
	}
	if evs[2].Kind != kvevents.BlockRemoved {
		t.Fatalf("third event %+v", evs[2])
	}
	// The index, keyed by tokens, reads them as llmlb hashes the prompt.
	x := kvevents.NewIndex(0)
	x.SetKeyByTokens(true)
	root := a.events([]kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: pa.Blocks[:1], Medium: kvevents.MediumGPU}})
	x.Apply("r", kvevents.Batch{Events: append(root, first)}, time.Unix(1e9, 0))
	if gpu, _ := x.Match("r", tokenize.FromTokenIDs(ids).Blocks, time.Unix(1e9, 0)); gpu != 3 {
		t.Fatalf("index matches %d blocks, want 3", gpu)
	}
}

func TestMessageTextJoinsTextParts(t *testing.T) {
	// As vLLM joins them for a template that takes a string, and as
	// llmlb's request parser does: the prompts hash alike.
	got, err := messageText([]byte(`[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x"}},{"type":"text","text":"b"}]`))
	if err != nil || got != "a\nb" {
		t.Fatalf("messageText = %q, %v; want \"a\\nb\"", got, err)
	}
}
