package request

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// TestAgentAPIs: the Anthropic Messages API (Claude-style agents) and the
// Responses API (Codex-style agents) are profiled like chat: the model, the
// system prompt at the head of the rendered prompt, tool calls and their
// results as prompt text, tools counted, the output limit read.
func TestAgentAPIs(t *testing.T) {
	render := func(msgs ...tokenize.Message) string { return tokenize.RenderChat(msgs) }
	tools := `[{"name":"read","input_schema":{}}]`
	tests := []struct {
		name, path, body string
		want             Profile
	}{
		{"messages", "/v1/messages",
			`{"model":"claude","system":"You code.","max_tokens":900,"tools":` + tools + `,"messages":[` +
				`{"role":"user","content":"fix it"},` +
				`{"role":"assistant","content":[{"type":"text","text":"reading"},{"type":"tool_use","id":"t1","name":"read","input":{"path":"a.go"}}]},` +
				`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"package a"}]}]}`,
			Profile{Model: "claude", PrefixKey: md5hex("You code."), OutputTokens: 900,
				PromptTokens: tokenize.CountText(render(
					tokenize.Message{Role: "system", Content: "You code."},
					tokenize.Message{Role: "user", Content: "fix it"},
					tokenize.Message{Role: "assistant", Content: "reading\nread{\"path\":\"a.go\"}"},
					tokenize.Message{Role: "user", Content: "package a"})) + tokenize.CountText(tools)}},
		{"responses, string input", "/v1/responses", `{"model":"gpt","instructions":"Be terse.","input":"hello"}`,
			Profile{Model: "gpt", PrefixKey: md5hex("Be terse."), OutputTokens: 256,
				PromptTokens: tokenize.CountText(render(
					tokenize.Message{Role: "system", Content: "Be terse."},
					tokenize.Message{Role: "user", Content: "hello"}))}},
		{"responses, items", "/v1/responses",
			`{"model":"gpt","max_output_tokens":64,"input":[` +
				`{"role":"user","content":[{"type":"input_text","text":"list files"}]},` +
				`{"type":"function_call","call_id":"c1","name":"ls","arguments":"{}"},` +
				`{"type":"function_call_output","call_id":"c1","output":"a.go"},` +
				`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"one file"}]},` +
				`{"type":"reasoning","summary":[]}]}`,
			Profile{Model: "gpt", OutputTokens: 64,
				PromptTokens: tokenize.CountText(render(
					tokenize.Message{Role: "user", Content: "list files"},
					tokenize.Message{Role: "assistant", Content: "ls{}"},
					tokenize.Message{Role: "tool", Content: "a.go"},
					tokenize.Message{Role: "assistant", Content: "one file"},
					tokenize.Message{Role: "reasoning", Content: `{"summary":[],"type":"reasoning"}`}))}},
		{"responses, odd input", "/v1/responses", `{"model":"gpt","input":[7,{"x":1}],"instructions":5}`,
			Profile{Model: "gpt", OutputTokens: 256,
				PromptTokens: tokenize.CountText(render(
					tokenize.Message{Role: "user", Content: "7"},
					tokenize.Message{Role: "item", Content: `{"x":1}`}))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !Routed(tt.path) {
				t.Fatalf("Routed(%q) = false", tt.path)
			}
			p, err := Parse(DefaultConfig(), tt.path, http.Header{}, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, p); diff != "" {
				t.Errorf("profile mismatch (-want +got):\n%s", diff)
			}
		})
	}
	for _, path := range []string{"/v1/audio/transcriptions", "/v1/rerank", "/v1/models"} {
		if Routed(path) {
			t.Errorf("Routed(%q) = true", path)
		}
	}
}

// TestAgentTurnsShareBlocks: an agent's next turn (the same conversation
// with more appended) starts with the blocks of the turn before, on both
// agent APIs, so that the cache-aware policies find it where its context is;
// two sessions with the same long system prompt share its blocks.
func TestAgentTurnsShareBlocks(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PromptBlocks = true
	system := strings.Repeat("You are a careful coding agent. ", 40)
	blocks := func(path, body string) []uint64 {
		t.Helper()
		p, err := Parse(cfg, path, http.Header{}, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return p.PromptBlocks
	}
	leading := func(a, b []uint64) int {
		n := 0
		for n < len(a) && n < len(b) && a[n] == b[n] {
			n++
		}
		return n
	}
	turn1 := `{"role":"user","content":"` + strings.Repeat("read the repository ", 30) + `"}`
	turn2 := `{"role":"assistant","content":[{"type":"text","text":"` + strings.Repeat("done ", 50) + `"}]},{"role":"user","content":"next"}`
	m1 := blocks("/v1/messages", `{"model":"m","system":"`+system+`","messages":[`+turn1+`]}`)
	m2 := blocks("/v1/messages", `{"model":"m","system":"`+system+`","messages":[`+turn1+`,`+turn2+`]}`)
	if n := leading(m1, m2); n < len(m1)-1 {
		t.Errorf("messages: turn 2 shares %d leading blocks of turn 1's %d", n, len(m1))
	}
	other := blocks("/v1/messages", `{"model":"m","system":"`+system+`","messages":[{"role":"user","content":"something else"}]}`)
	if n := leading(m1, other); n < len(system)/4/tokenize.BlockSize-2 {
		t.Errorf("messages: two sessions share %d blocks of a system prompt of about %d", n, len(system)/4/tokenize.BlockSize)
	}
	item2 := `{"type":"function_call","name":"ls","arguments":"{}"},{"type":"function_call_output","output":"` + strings.Repeat("file ", 80) + `"}`
	r1 := blocks("/v1/responses", `{"model":"m","instructions":"`+system+`","input":[`+turn1+`]}`)
	r2 := blocks("/v1/responses", `{"model":"m","instructions":"`+system+`","input":[`+turn1+`,`+item2+`]}`)
	if n := leading(r1, r2); n < len(r1)-1 {
		t.Errorf("responses: turn 2 shares %d leading blocks of turn 1's %d", n, len(r1))
	}
}

// TestClaudeCodeBillingHeaderLeftOut: Claude Code heads its system prompt
// with a block whose cch changes on every request; two turns must still
// share their prefix key and their blocks, as they share the engine's
// cache (vLLM drops the block).
func TestClaudeCodeBillingHeaderLeftOut(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PromptBlocks = true
	system := strings.Repeat("You are Claude Code, a coding agent. ", 40)
	body := func(cch string) string {
		return `{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=` + cch + `;"},` +
			`{"type":"text","text":"` + system + `","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"` + strings.Repeat("fix the tests ", 40) + `"}]}`
	}
	a, err := Parse(cfg, "/v1/messages", http.Header{}, []byte(body("71fea")))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse(cfg, "/v1/messages", http.Header{}, []byte(body("0aaa9")))
	if err != nil {
		t.Fatal(err)
	}
	if a.PrefixKey != b.PrefixKey || !slices.Equal(a.PromptBlocks, b.PromptBlocks) || len(a.PromptBlocks) == 0 {
		t.Fatalf("requests differing only in cch: prefix keys %q / %q, %d / %d blocks, equal %v",
			a.PrefixKey, b.PrefixKey, len(a.PromptBlocks), len(b.PromptBlocks), slices.Equal(a.PromptBlocks, b.PromptBlocks))
	}
	plain := strings.Replace(body("x"), `{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.117.48f; cc_entrypoint=cli; cch=x;"},`, "", 1)
	c, err := Parse(cfg, "/v1/messages", http.Header{}, []byte(plain))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(a.PromptBlocks, c.PromptBlocks) {
		t.Fatal("the billing header block changes the prompt's blocks")
	}
}
