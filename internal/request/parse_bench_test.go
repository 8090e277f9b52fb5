package request

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// agenticBody is a chat request of about `tokens` tokens: a shared system
// prompt, tools and a growing dialogue, as an agent sends it.
func agenticBody(tokens int) []byte {
	msgs := []map[string]any{{"role": "system", "content": strings.Repeat("You are a careful coding agent. ", 64)}}
	for i := 0; len(msgs) < 2 || 4*tokens > i*2000; i++ {
		msgs = append(msgs,
			map[string]any{"role": "user", "content": fmt.Sprintf("step %d: ", i) + strings.Repeat("please read the file and fix it. ", 30)},
			map[string]any{"role": "assistant", "content": strings.Repeat("done; here is the diff. ", 40)})
	}
	body, err := json.Marshal(map[string]any{
		"model": "qwen3-coder", "stream": true, "max_tokens": 1024, "messages": msgs,
		"metadata": map[string]any{"user_id": "user_ab_account_cd_session_0123"},
	})
	if err != nil {
		panic(err)
	}
	return body
}

func BenchmarkParse(b *testing.B) {
	for _, tokens := range []int{1000, 8000, 100000} {
		body := agenticBody(tokens)
		for _, blocks := range []bool{false, true} {
			b.Run(fmt.Sprintf("tokens=%d,blocks=%v", tokens, blocks), func(b *testing.B) {
				cfg := DefaultConfig()
				cfg.PromptBlocks = blocks
				h := http.Header{"X-Project-Id": {"p1"}}
				b.SetBytes(int64(len(body)))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := Parse(cfg, chatPath, h, body); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkParseSmall is the proxy benchmark's request (BenchmarkProxy in
// internal/proxy, scripts/proxybench.sh): a short chat, where Parse's fixed
// costs (allocations, reflection) outweigh its per-byte ones.
func BenchmarkParseSmall(b *testing.B) {
	body := []byte(`{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello."}]}`)
	h := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"wrk"}}
	cfg := DefaultConfig()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(cfg, chatPath, h, body); err != nil {
			b.Fatal(err)
		}
	}
}
