package request

import (
	"bytes"
	"net/http"
	"runtime"
	"testing"
)

// hugeTokenIDs is a /v1/completions body whose prompt is n token ids
// (issue 10, item 5: 15M ids in 30 MB).
func hugeTokenIDs(n int) []byte {
	var b bytes.Buffer
	b.Grow(2*n + 64)
	b.WriteString(`{"model":"m","prompt":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('1' + byte(i%9))
	}
	b.WriteString(`],"max_tokens":16}`)
	return b.Bytes()
}

// BenchmarkParseHugeTokenIDs: the cost of profiling one 15M-token-id
// completions request, the work three such clients used to take from all
// others (issue 10, item 5). Compare ns/op and B/op with BenchmarkParse.
func BenchmarkParseHugeTokenIDs(b *testing.B) {
	body := hugeTokenIDs(15_000_000)
	for _, blocks := range []bool{false, true} {
		b.Run(map[bool]string{false: "blocks=false", true: "blocks=true"}[blocks], func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.PromptBlocks = blocks
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := Parse(cfg, "/v1/completions", http.Header{}, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestHugeTokenIDsBoundedAllocations (issue 10, item 5): profiling a 30 MB
// completions body of 15M token ids allocates a small fraction of the body
// (the token count is exact, the text hashed for prefix and blocks is
// capped), instead of ~1 GB.
func TestHugeTokenIDsBoundedAllocations(t *testing.T) {
	const ids = 15_000_000
	body := hugeTokenIDs(ids)
	cfg := DefaultConfig()
	cfg.PromptBlocks = true // the most expensive profile (prefix-tree)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p, err := Parse(cfg, "/v1/completions", http.Header{}, body)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if p.PromptTokens != ids || p.PrefixKey == "" || len(p.PromptBlocks) == 0 {
		t.Fatalf("profile: %d tokens, prefix %q, %d blocks", p.PromptTokens, p.PrefixKey, len(p.PromptBlocks))
	}
	if got, limit := after.TotalAlloc-before.TotalAlloc, uint64(len(body))/4; got > limit {
		t.Fatalf("profiling a %d MiB body allocated %d MiB, want < %d MiB", len(body)>>20, got>>20, limit>>20)
	}
}
