package request

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// byteTokenizer is a model tokenizer for tests: one token per byte, a
// message rendered as "<role>content", a completion prompt led by token 1.
type byteTokenizer struct{ calls int }

func (b *byteTokenizer) ChatTokens(msgs []tokenize.Message) ([]uint32, error) {
	b.calls++
	var s strings.Builder
	for _, m := range msgs {
		if m.Role == "refused" {
			return nil, errors.New("the template refuses the conversation")
		}
		s.WriteString("<" + m.Role + ">" + m.Content)
	}
	return bytesIDs(s.String()), nil
}

// ChatRequestTokens renders "[tools]" then each message as
// "<role>content", a tool call as "{name}".
// A Responses API request renders as "[responses]" and its raw input.
func (b *byteTokenizer) ChatRequestTokens(req ChatRequest) ([]uint32, error) {
	messages, tools := req.Messages, req.Tools
	b.calls++
	if req.Responses {
		return bytesIDs("[responses]" + string(req.Input)), nil
	}
	var msgs []struct {
		Role      string          `json:"role"`
		Raw       json.RawMessage `json:"content"`
		Content   string
		ToolCalls []struct {
			Function struct{ Name string } `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(messages, &msgs); err != nil {
		return nil, err
	}
	for i := range msgs {
		var parts []struct{ Text string }
		if json.Unmarshal(msgs[i].Raw, &msgs[i].Content) != nil && json.Unmarshal(msgs[i].Raw, &parts) == nil {
			for j, p := range parts {
				if j > 0 {
					msgs[i].Content += "\n"
				}
				msgs[i].Content += p.Text
			}
		}
	}
	var s strings.Builder
	if req.Anthropic {
		s.WriteString("[anthropic]")
	}
	if len(tools) > 0 {
		s.WriteString("[tools]")
	}
	for _, m := range msgs {
		s.WriteString("<" + m.Role + ">" + m.Content)
		for _, c := range m.ToolCalls {
			s.WriteString("{" + c.Function.Name + "}")
		}
	}
	return bytesIDs(s.String()), nil
}

func (b *byteTokenizer) PromptTokens(p string) ([]uint32, error) {
	b.calls++
	return append([]uint32{1}, bytesIDs(p)...), nil
}

func bytesIDs(s string) []uint32 {
	ids := make([]uint32, len(s))
	for i := range len(s) {
		ids[i] = uint32(s[i])
	}
	return ids
}

func TestParseHashesTheModelsTokens(t *testing.T) {
	tok := &byteTokenizer{}
	cfg := DefaultConfig()
	cfg.PromptBlocks = true
	cfg.Tokenizer = func(model string) PromptTokenizer {
		if model == "qwen" {
			return tok
		}
		return nil
	}
	long := strings.Repeat("the quick brown fox ", 20)
	chatIDs := bytesIDs("<system>be brief<user>" + long)
	cases := []struct {
		name, path, body string
		ids              []uint32 // nil: hashed from the text
	}{
		{"chat", chatPath, `{"model":"qwen","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + long + `"}]}`, chatIDs},
		{"chat, text parts", chatPath, `{"model":"qwen","messages":[{"role":"system","content":[{"type":"text","text":"be brief"}]},{"role":"user","content":"` + long + `"}]}`, chatIDs},
		{"chat, generation prompt said on", chatPath, `{"model":"qwen","add_generation_prompt":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"` + long + `"}]}`, chatIDs},
		{"completion", compPath, `{"model":"qwen","prompt":"` + long + `"}`, append([]uint32{1}, bytesIDs(long)...)},
		{"completion of token ids", compPath, `{"model":"qwen","prompt":[` + strings.Repeat("7,", 40) + `7]}`, slices.Repeat([]uint32{7}, 41)},
		{"another model", chatPath, `{"model":"llama","messages":[{"role":"user","content":"` + long + `"}]}`, nil},
		{"tools", chatPath, `{"model":"qwen","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"` + long + `"}]}`, bytesIDs("[tools]<user>" + long)},
		{"tool calls", chatPath, `{"model":"qwen","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"1","content":"ok"},{"role":"user","content":"` + long + `"}]}`, bytesIDs("<assistant>{f}<tool>ok<user>" + long)},
		{"too large", chatPath, `{"model":"qwen","messages":[{"role":"user","content":"` + strings.Repeat("x", MaxPromptBlockBytes+1) + `"}]}`, nil},
		{"an image part", chatPath, `{"model":"qwen","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://x"}},{"type":"text","text":"` + long + `"}]}]}`, nil},
		{"template arguments", chatPath, `{"model":"qwen","chat_template_kwargs":{"enable_thinking":false},"messages":[{"role":"user","content":"` + long + `"}]}`, bytesIDs("<user>" + long)},
		{"a template of its own", chatPath, `{"model":"qwen","chat_template":"{{ messages }}","messages":[{"role":"user","content":"` + long + `"}]}`, nil},
		{"no generation prompt", chatPath, `{"model":"qwen","add_generation_prompt":false,"messages":[{"role":"user","content":"` + long + `"}]}`, nil},
		{"the template refuses", chatPath, `{"model":"qwen","messages":[{"role":"refused","content":"` + long + `"}]}`, nil},
		{"too many messages", chatPath, `{"model":"qwen","messages":[` + strings.Repeat(`{"role":"user","content":"x"},`, maxTokenizedMessages) + `{"role":"user","content":"` + long + `"}]}`, nil},
		{"anthropic messages", "/v1/messages", `{"model":"qwen","system":"be brief","max_tokens":8,"messages":[{"role":"user","content":"` + long + `"}]}`, bytesIDs("[anthropic]<user>" + long)},
		{"anthropic messages, another model", "/v1/messages", `{"model":"llama","max_tokens":8,"messages":[{"role":"user","content":"` + long + `"}]}`, nil},
		{"responses", "/v1/responses", `{"model":"qwen","instructions":"be brief","input":"` + long + `"}`, bytesIDs(`[responses]"` + long + `"`)},
		{"responses, items", "/v1/responses", `{"model":"qwen","input":[{"role":"user","content":"` + long + `"}]}`, bytesIDs(`[responses][{"role":"user","content":"` + long + `"}]`)},
		{"responses, another model", "/v1/responses", `{"model":"llama","input":"` + long + `"}`, nil},
		{"responses, a previous response", "/v1/responses", `{"model":"qwen","previous_response_id":"resp_1","input":"` + long + `"}`, nil},
		{"responses, a conversation", "/v1/responses", `{"model":"qwen","conversation":"conv_1","input":"` + long + `"}`, nil},
		{"responses, a stored prompt", "/v1/responses", `{"model":"qwen","prompt":{"id":"pmpt_1"},"input":"` + long + `"}`, nil},
		{"responses, too many items", "/v1/responses", `{"model":"qwen","input":[` + strings.Repeat(`{"role":"user","content":"x"},`, maxTokenizedMessages) + `{"role":"user","content":"` + long + `"}]}`, nil},
		{"a batch of prompts", compPath, `{"model":"qwen","prompt":["` + long + `","` + long + `"]}`, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p, err := Parse(cfg, c.path, nil, []byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if c.ids == nil {
				textCfg := cfg
				textCfg.Tokenizer = nil
				want, _ := Parse(textCfg, c.path, nil, []byte(c.body))
				if !slices.Equal(p.PromptBlocks, want.PromptBlocks) || p.PromptTokens != want.PromptTokens {
					t.Fatalf("not hashed from the text: %d tokens %x, want %d tokens %x", p.PromptTokens, p.PromptBlocks, want.PromptTokens, want.PromptBlocks)
				}
				return
			}
			want := tokenize.FromTokenIDs(c.ids)
			if !slices.Equal(p.PromptBlocks, want.Blocks) || p.PromptTokens != len(c.ids) {
				t.Fatalf("blocks %x (%d tokens), want %x (%d tokens)", p.PromptBlocks, p.PromptTokens, want.Blocks, len(c.ids))
			}
		})
	}
	// Without PromptBlocks nothing is tokenized.
	tok.calls = 0
	cfg.PromptBlocks = false
	if _, err := Parse(cfg, chatPath, nil, []byte(cases[0].body)); err != nil || tok.calls != 0 {
		t.Fatalf("PromptBlocks off: %d tokenizer calls, err %v", tok.calls, err)
	}
}
