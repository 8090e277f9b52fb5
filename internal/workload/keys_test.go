package workload

import (
	"slices"
	"testing"

	"github.com/llmlb/llmlb/internal/tokenize"
)

func TestExtendPromptMatchesFromBlockKeys(t *testing.T) {
	keyed := func(n int, id uint64) []uint64 {
		keys := make([]uint64, n)
		for j := range keys {
			keys[j] = blockKey(id, j)
		}
		return keys
	}
	tests := []struct {
		name          string
		tokens        int
		prefixBlocks  int // blocks taken from a shared prefix keyed by id 1
		ownID, prefID uint64
	}{
		{"no prefix", 1000, 0, 7, 1},
		{"prefix then own blocks", 1000, 20, 7, 1},
		{"prefix longer than the prompt", 100, 20, 7, 1},
		{"exactly the prefix", 320, 20, 7, 1},
		{"shorter than a block", 15, 0, 7, 1},
		{"empty", 0, 0, 7, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefixKeys := keyed(tt.prefixBlocks, tt.prefID)
			prefix := chain(nil, prefixKeys...)
			n := tt.tokens / tokenize.BlockSize
			keys := append(slices.Clone(prefixKeys), keyed(max(n, len(prefixKeys)), tt.ownID)[min(len(prefixKeys), n):]...)
			want := tokenize.FromBlockKeys(tt.tokens, keys[:min(n, len(keys))])
			got := extendPrompt(tt.tokens, prefix, tt.ownID)
			if got.Tokens != want.Tokens || !slices.Equal(got.Blocks, want.Blocks) || len(got.Blocks) != n {
				t.Errorf("extendPrompt = %d tokens %d blocks, FromBlockKeys = %d tokens %d blocks (equal=%v)",
					got.Tokens, len(got.Blocks), want.Tokens, len(want.Blocks), slices.Equal(got.Blocks, want.Blocks))
			}
			if len(prefix) > 0 && n > 0 {
				// The prompt is a copy: changing it leaves the prefix alone.
				got.Blocks[0]++
				if prefix[0] == got.Blocks[0] {
					t.Error("extendPrompt shares its prefix's backing array")
				}
			}
		})
	}
}
