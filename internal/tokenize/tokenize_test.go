package tokenize

import (
	"strings"
	"testing"
)

func TestCountText(t *testing.T) {
	tests := []struct {
		name string
		text string
		want int
	}{
		{"empty", "", 0},
		{"one char", "a", 1},
		{"one token", "abcd", 1},
		{"five chars", "abcde", 2},
		{"one block", strings.Repeat("x", 64), 16},
		{"multibyte counts bytes", "héllo", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := CountText(tt.text); got != tt.want {
				t.Errorf("CountText(%q) = %d, want %d", tt.text, got, tt.want)
			}
			if got := FromText(tt.text).Tokens; got != tt.want {
				t.Errorf("FromText(%q).Tokens = %d, want %d", tt.text, got, tt.want)
			}
		})
	}
}

func TestFromTextBlocks(t *testing.T) {
	base := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 10) // 450 bytes
	tests := []struct {
		name       string
		a, b       string
		wantBlocks int // len(FromText(b).Blocks)
		wantShared int // SharedBlocks(FromText(a), FromText(b))
	}{
		{"identical", base, base, 7, 7},
		{"shared prefix, different tail", base + "alpha", base + "omega", 7, 7},
		{"difference in block 3", base, base[:200] + "X" + base[201:], 7, 3},
		{"difference in first byte", base, "Z" + base[1:], 7, 0},
		{"partial block never hashed", base[:60], base[:60], 0, 0},
		{"short last token still fills a block", base[:63], base[:63], 1, 1},
		{"longer prompt extends", base[:128], base, 7, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pa, pb := FromText(tt.a), FromText(tt.b)
			if len(pb.Blocks) != tt.wantBlocks {
				t.Errorf("blocks = %d, want %d", len(pb.Blocks), tt.wantBlocks)
			}
			if len(pb.Blocks) != pb.Tokens/BlockSize {
				t.Errorf("len(Blocks) = %d, want Tokens/BlockSize = %d", len(pb.Blocks), pb.Tokens/BlockSize)
			}
			if got := SharedBlocks(pa, pb); got != tt.wantShared {
				t.Errorf("SharedBlocks = %d, want %d", got, tt.wantShared)
			}
		})
	}
}

func TestChainingIsPositional(t *testing.T) {
	// The same 64 bytes at different positions must hash differently:
	// a block's hash covers its whole prefix.
	blk := strings.Repeat("abcd", 16)
	p := FromText(blk + blk)
	if p.Blocks[0] == p.Blocks[1] {
		t.Fatal("equal blocks at different positions hash equal; chaining is broken")
	}
}

func TestFromBlockKeysMatchesFromText(t *testing.T) {
	text := strings.Repeat("0123456789abcdef", 13) // 208 bytes: 3 full blocks + 16 bytes
	var keys []uint64
	for i := 0; i+64 <= len(text); i += 64 {
		keys = append(keys, KeyOfText(text[i:i+64]))
	}
	want := FromText(text)
	got := FromBlockKeys(CountText(text), keys)
	if got.Tokens != want.Tokens || len(got.Blocks) != len(want.Blocks) {
		t.Fatalf("FromBlockKeys = %+v, want %+v", got, want)
	}
	for i := range want.Blocks {
		if got.Blocks[i] != want.Blocks[i] {
			t.Fatalf("block %d: %x, want %x", i, got.Blocks[i], want.Blocks[i])
		}
	}
}

func TestFromBlockKeysBadInput(t *testing.T) {
	tests := []struct {
		name       string
		tokens     int
		keys       []uint64
		wantTokens int
		wantBlocks int
	}{
		{"exact", 48, []uint64{1, 2, 3}, 48, 3},
		{"partial tail", 50, []uint64{1, 2, 3}, 50, 3},
		{"extra keys ignored", 32, []uint64{1, 2, 3}, 32, 2},
		{"missing keys", 64, []uint64{1}, 64, 1},
		{"negative tokens", -5, []uint64{1}, 0, 0},
		{"nil keys", 100, nil, 100, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := FromBlockKeys(tt.tokens, tt.keys)
			if p.Tokens != tt.wantTokens || len(p.Blocks) != tt.wantBlocks {
				t.Errorf("got tokens=%d blocks=%d, want %d/%d", p.Tokens, len(p.Blocks), tt.wantTokens, tt.wantBlocks)
			}
		})
	}
	a, b := FromBlockKeys(48, []uint64{1, 2, 3}), FromBlockKeys(48, []uint64{1, 2, 4})
	if SharedBlocks(a, b) != 2 {
		t.Errorf("SharedBlocks = %d, want 2", SharedBlocks(a, b))
	}
}

func TestRenderChat(t *testing.T) {
	tests := []struct {
		name string
		msgs []Message
		want string
	}{
		{"empty", nil, "<|assistant|>\n"},
		{"system and user", []Message{{"system", "Be brief."}, {"user", "Hi"}},
			"<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := RenderChat(tt.msgs); got != tt.want {
				t.Errorf("RenderChat = %q, want %q", got, tt.want)
			}
		})
	}
	// Equal leading messages give an equal text prefix, hence shared blocks.
	sys := Message{"system", strings.Repeat("You are a coding agent. ", 40)}
	t1 := RenderChat([]Message{sys, {"user", "fix the bug"}})
	t2 := RenderChat([]Message{sys, {"user", "write a test"}})
	if SharedBlocks(FromText(t1), FromText(t2)) < len(sys.Content)/64-1 {
		t.Errorf("shared system prompt gives only %d shared blocks", SharedBlocks(FromText(t1), FromText(t2)))
	}
}

func BenchmarkFromText(b *testing.B) {
	text := strings.Repeat("x", 32*1024*4) // 32K tokens
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		_ = FromText(text)
	}
}

func TestFromTokenIDs(t *testing.T) {
	ids := make([]uint32, 3*BlockSize+5)
	for i := range ids {
		ids[i] = uint32(1000 + i)
	}
	p := FromTokenIDs(ids)
	if p.Tokens != len(ids) || len(p.Blocks) != 3 {
		t.Fatalf("FromTokenIDs: %d tokens, %d blocks; want %d, 3", p.Tokens, len(p.Blocks), len(ids))
	}
	// Block by block, as an index extends a chain from an engine's events.
	parent := TokenRootHash
	for i, h := range p.Blocks {
		parent = ChainHash(parent, KeyOfTokens(ids[i*BlockSize:(i+1)*BlockSize]))
		if h != parent {
			t.Fatalf("block %d: %x, chained by hand %x", i, h, parent)
		}
	}
	// A changed token changes its block and every later one, not earlier ones.
	ids[BlockSize+3]++
	q := FromTokenIDs(ids)
	if q.Blocks[0] != p.Blocks[0] || q.Blocks[1] == p.Blocks[1] || q.Blocks[2] == p.Blocks[2] {
		t.Fatalf("changing block 1's tokens: before %x, after %x", p.Blocks, q.Blocks)
	}
	// Ids that spell a text's bytes do not meet that text's blocks.
	text := strings.Repeat("abcd", BlockSize)
	spelled := make([]uint32, BlockSize)
	for i := range spelled {
		spelled[i] = uint32('a') | uint32('b')<<8 | uint32('c')<<16 | uint32('d')<<24
	}
	if FromTokenIDs(spelled).Blocks[0] == FromText(text).Blocks[0] {
		t.Fatal("a token-id block and a text block share a hash")
	}
	if got := FromTokenIDs(nil); got.Tokens != 0 || len(got.Blocks) != 0 {
		t.Fatalf("FromTokenIDs(nil) = %+v", got)
	}
}
