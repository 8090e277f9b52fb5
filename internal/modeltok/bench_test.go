package modeltok

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/testutil/qwentok"
)

// chatBody is an agent-like conversation of turns messages, about 250
// tokens each, after a 1,000-token system prompt.
func chatBody(turns int) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	msgs := []msg{{"system", strings.Repeat("You are a careful assistant for a Go code base. ", 100)}}
	for i := range turns {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, msg{role, fmt.Sprintf("turn %d: ", i) + strings.Repeat("func (s *Server) handle(w http.ResponseWriter, r *http.Request) { return } ", 12)})
	}
	b, _ := json.Marshal(map[string]any{"model": "qwen", "messages": msgs, "max_tokens": 128})
	return b
}

// agentBody is chatBody's conversation as a coding agent has it: three
// tools defined, the assistant's turns calling one, each answered by a
// tool message.
func agentBody(turns int) []byte {
	var req struct {
		Model    string           `json:"model"`
		Tools    json.RawMessage  `json:"tools"`
		Messages []map[string]any `json:"messages"`
	}
	if err := json.Unmarshal(chatBody(turns), &req); err != nil {
		panic(err)
	}
	req.Tools = json.RawMessage(`[` + strings.TrimSuffix(strings.Repeat(`{"type":"function","function":{"name":"read_file","description":"Reads a file from the workspace and returns its text.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"Path from the workspace root"},"limit":{"type":"integer"}},"required":["path"]}}},`, 3), ",") + `]`)
	var msgs []map[string]any
	for i, m := range req.Messages {
		if m["role"] == "assistant" {
			id := fmt.Sprintf("call_%d", i)
			msgs = append(msgs,
				map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function", "function": map[string]any{"name": "read_file", "arguments": `{"path": "server.go"}`}}}},
				map[string]any{"role": "tool", "tool_call_id": id, "content": m["content"]})
			continue
		}
		msgs = append(msgs, m)
	}
	req.Messages = msgs
	b, _ := json.Marshal(req)
	return b
}

// parseConfigs returns request.Parse's configuration with Qwen2.5's
// tokenizer for model "qwen", and the same without a tokenizer.
func parseConfigs(b *testing.B) (withTok, text request.Config) {
	set, err := LoadAll([]Config{{Models: []string{"qwen"}, Path: qwentok.Dir(b)}})
	if err != nil {
		b.Fatal(err)
	}
	withTok = request.DefaultConfig()
	withTok.PromptBlocks = true
	withTok.Tokenizer = set.For
	text = withTok
	text.Tokenizer = nil
	return withTok, text
}

// benchParsePair runs request.Parse of body on path without the tokenizer
// and with it, as sub-benchmarks named by the prompt's size and prefix,
// and returns the prompt's tokens; it fails when the tokenizer does not
// tokenize body.
func benchParsePair(b *testing.B, withTok, text request.Config, path, prefix string, body []byte) (tokens int) {
	p, err := request.Parse(withTok, path, nil, body)
	if err != nil || !p.TokenBlocks {
		b.Fatalf("%s request not tokenized: %v", path, err)
	}
	b.Run(fmt.Sprintf("%dk-tokens/%stext", p.PromptTokens/1000, prefix), func(b *testing.B) {
		for b.Loop() {
			_, _ = request.Parse(text, path, nil, body)
		}
	})
	b.Run(fmt.Sprintf("%dk-tokens/%stokenizer", p.PromptTokens/1000, prefix), func(b *testing.B) {
		for b.Loop() {
			_, _ = request.Parse(withTok, path, nil, body)
		}
	})
	return p.PromptTokens
}

// BenchmarkParse measures request.Parse of a chat request with the
// model's tokenizer (blocks hashed over its token ids) against the
// pseudo-tokenizer: the work added to every request of a model that has
// one. "next turn" parses one turn longer than the conversation before it,
// whose messages the tokenizer's cache already holds.
func BenchmarkParse(b *testing.B) {
	withTok, text := parseConfigs(b)
	for _, turns := range []int{8, 64} {
		body := agentBody(turns)
		benchParsePair(b, withTok, text, "/v1/chat/completions", "tools/", body)
	}
	for _, turns := range []int{8, 64} {
		body := chatBody(turns)
		tokens := benchParsePair(b, withTok, text, "/v1/chat/completions", "", body)
		// Every message new every time: nothing of it is cached.
		b.Run(fmt.Sprintf("%dk-tokens/tokenizer-cold", tokens/1000), func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				cold := strings.ReplaceAll(string(body), "handle(", fmt.Sprintf("handle%d(", i))
				cold = strings.Replace(cold, "careful", fmt.Sprintf("careful%d", i), 1)
				_, _ = request.Parse(withTok, "/v1/chat/completions", nil, []byte(cold))
			}
		})
	}
}

// responsesBody is agentBody's conversation as a Codex-style agent sends
// it to /v1/responses: the system prompt as instructions, flat function
// tools, the assistant's turns as function_call items each answered by a
// function_call_output.
func responsesBody(turns int) []byte {
	var chat struct {
		Messages []struct{ Role, Content string }
	}
	if err := json.Unmarshal(chatBody(turns), &chat); err != nil {
		panic(err)
	}
	var items []map[string]any
	for i, m := range chat.Messages[1:] {
		if m.Role == "assistant" {
			id := fmt.Sprintf("call_%d", i)
			items = append(items,
				map[string]any{"type": "function_call", "call_id": id, "name": "read_file", "arguments": `{"path": "server.go"}`},
				map[string]any{"type": "function_call_output", "call_id": id, "output": m.Content})
			continue
		}
		items = append(items, map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": m.Content}}})
	}
	tools := json.RawMessage(`[` + strings.TrimSuffix(strings.Repeat(`{"type":"function","name":"read_file","description":"Reads a file from the workspace and returns its text.","parameters":{"type":"object","properties":{"path":{"type":"string","description":"Path from the workspace root"},"limit":{"type":"integer"}},"required":["path"]}},`, 3), ",") + `]`)
	b, _ := json.Marshal(map[string]any{"model": "qwen", "instructions": chat.Messages[0].Content, "tools": tools, "input": items, "max_output_tokens": 128})
	return b
}

// BenchmarkParseResponses measures request.Parse of a /v1/responses
// request with the model's tokenizer (turned into its chat, rendered and
// tokenized) against the pseudo-tokenizer.
func BenchmarkParseResponses(b *testing.B) {
	withTok, text := parseConfigs(b)
	for _, turns := range []int{8, 64} {
		body := responsesBody(turns)
		benchParsePair(b, withTok, text, "/v1/responses", "", body)
	}
}
