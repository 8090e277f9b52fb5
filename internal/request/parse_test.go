package request

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/llmlb/llmlb/internal/tokenize"
)

const (
	chatPath = "/v1/chat/completions"
	compPath = "/v1/completions"
	embPath  = "/v1/embeddings"
)

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, path, body, want string
	}{
		{"empty body", chatPath, "", "empty body"},
		{"blank body", chatPath, " \n ", "empty body"},
		{"array body", chatPath, `[{"model":"m"}]`, "body must be a JSON object"},
		{"string body", compPath, `"hi"`, "body must be a JSON object"},
		{"truncated JSON", chatPath, `{"model":"m",`, "malformed JSON body"},
		{"trailing garbage", chatPath, `{"model":"m"} x`, "malformed JSON body"},
		{"bad token", chatPath, `{"model": nope}`, "malformed JSON body"},
		{"deep nesting", chatPath, `{"model":"m","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, "malformed JSON body"},
		{"missing model: chat", chatPath, `{"messages":[]}`, `missing "model"`},
		{"missing model: completions", compPath, `{"prompt":"hi"}`, `missing "model"`},
		{"missing model: embeddings", embPath, `{"input":"hi"}`, `missing "model"`},
		{"missing model: messages", "/v1/messages", `{"messages":[]}`, `missing "model"`},
		{"missing model: responses", "/v1/responses", `{"input":"hi"}`, `missing "model"`},
		{"messages API body not an object", "/v1/messages", `[1]`, "body must be a JSON object"},
		{"responses API body truncated", "/v1/responses", `{"model":"m","input":`, "malformed JSON body"},
		{"messages API messages not an array", "/v1/messages", `{"model":"m","messages":"x"}`, `"messages" must be an array`},
		{"max_output_tokens negative", "/v1/responses", `{"model":"m","max_output_tokens":-5}`, `"max_output_tokens" must be a positive integer`},
		{"null model", chatPath, `{"model":null}`, `missing "model"`},
		{"model not a string", chatPath, `{"model":7}`, `"model" must be a string`},
		{"empty model", chatPath, `{"model":""}`, `"model" must not be empty`},
		{"model with control char", chatPath, `{"model":"m\n"}`, "control characters"},
		{"model too long", chatPath, `{"model":"` + strings.Repeat("m", 600) + `"}`, "longer than"},
		{"messages not an array", chatPath, `{"model":"m","messages":{"role":"user"}}`, `"messages" must be an array`},
		{"message not an object", chatPath, `{"model":"m","messages":[1]}`, `invalid "messages"`},
		{"content a number", chatPath, `{"model":"m","messages":[{"role":"user","content":5}]}`, `"messages[0].content"`},
		{"content part a number", chatPath, `{"model":"m","messages":[{"role":"system","content":[1]}]}`, `"messages[0].content"`},
		{"max_tokens negative", chatPath, `{"model":"m","max_tokens":-1}`, `"max_tokens" must be a positive integer`},
		{"max_tokens zero", chatPath, `{"model":"m","max_tokens":0}`, `"max_tokens" must be a positive integer`},
		{"max_tokens fraction", chatPath, `{"model":"m","max_tokens":1.5}`, `"max_tokens" must be a positive integer`},
		{"max_tokens string", chatPath, `{"model":"m","max_tokens":"100"}`, `"max_tokens" must be a positive integer`},
		{"max_completion_tokens bad", chatPath, `{"model":"m","max_completion_tokens":true}`, `"max_completion_tokens"`},
		{"prompt an object", compPath, `{"model":"m","prompt":{}}`, `"prompt" must be a string`},
		{"input mixed array", embPath, `{"model":"m","input":["a",1]}`, `"input" must be a string`},
		{"token ids with a fraction", compPath, `{"model":"m","prompt":[1,2.5]}`, `"prompt" must be a string`},
		{"token ids mixed with a batch", compPath, `{"model":"m","prompt":[1,[2]]}`, `"prompt" must be a string`},
		{"token ids after a batch", compPath, `{"model":"m","prompt":[[1],2]}`, `"prompt" must be a string`},
		{"token ids nested too deep", compPath, `{"model":"m","prompt":[[[1]]]}`, `"prompt" must be a string`},
		{"token ids mixed with a string", compPath, `{"model":"m","prompt":[1,"a"]}`, `"prompt" must be a string`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse(DefaultConfig(), tt.path, http.Header{}, []byte(tt.body))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if !errors.Is(err, ErrBadRequest) {
				t.Errorf("error %v does not wrap ErrBadRequest", err)
			}
			if !strings.HasPrefix(err.Error(), "request: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q, want prefix \"request: \" and %q", err, tt.want)
			}
		})
	}
}

func TestParseTokens(t *testing.T) {
	chat := `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"` + strings.Repeat("word ", 200) + `"}]`
	rendered := tokenize.RenderChat([]tokenize.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: strings.Repeat("word ", 200)}})
	tools := `[{"type":"function","function":{"name":"f","parameters":{}}}]`
	tests := []struct {
		name string
		cfg  func(*Config)
		path string
		body string
		want Profile
	}{
		{"chat defaults", nil, chatPath, chat + `}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 256}},
		{"max_tokens", nil, chatPath, chat + `,"max_tokens":100}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 100}},
		{"max_completion_tokens first", nil, chatPath, chat + `,"max_tokens":100,"max_completion_tokens":50}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 50}},
		{"null max_completion_tokens falls back", nil, chatPath, chat + `,"max_tokens":100,"max_completion_tokens":null}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 100}},
		{"huge max_tokens capped", nil, chatPath, chat + `,"max_tokens":1e12}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: maxOutputTokens}},
		{"configured default output", func(c *Config) { c.DefaultOutputTokens = 64 }, chatPath, chat + `}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 64}},
		{"prompt blocks", func(c *Config) { c.PromptBlocks = true }, chatPath, chat + `}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 256, PromptBlocks: tokenize.FromText(rendered).Blocks}},
		{"tools count as prompt tokens", nil, chatPath, chat + `,"tools":` + tools + `}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered) + tokenize.CountText(tools), OutputTokens: 256}},
		{"tool calls are prompt text", nil, chatPath, `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]}`,
			Profile{Model: "m", PromptTokens: tokenize.CountText(tokenize.RenderChat([]tokenize.Message{{Role: "assistant", Content: `[{"id":"1"}]`}})), OutputTokens: 256}},
		{"completions", func(c *Config) { c.PromptBlocks = true }, compPath, `{"model":"m","prompt":"` + strings.Repeat("abcd", 40) + `","max_tokens":8}`,
			Profile{Model: "m", PrefixKey: md5hex(strings.Repeat("abcd", 40)), PromptTokens: 40, OutputTokens: 8, PromptBlocks: tokenize.FromText(strings.Repeat("abcd", 40)).Blocks}},
		{"completions token ids count exactly", nil, compPath, `{"model":"m","prompt":[5,6,7,8,9]}`,
			Profile{Model: "m", PrefixKey: md5hex("[5,6,7,8,9]"), PromptTokens: 5, OutputTokens: 256}},
		{"completions token ids with spaces: compact text", nil, compPath, `{"model":"m","prompt":[ 5, 6 ,7 ]}`,
			Profile{Model: "m", PrefixKey: md5hex("[5,6,7]"), PromptTokens: 3, OutputTokens: 256}},
		{"stream flag", nil, chatPath, chat + `,"stream":true}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 256, Stream: true}},
		{"embeddings", nil, embPath, `{"model":"e","input":["abcd","efgh"]}`,
			Profile{Model: "e", PromptTokens: tokenize.CountText("abcd\nefgh"), OutputTokens: 0}},
		{"embeddings token batches", nil, embPath, `{"model":"e","input":[[1,2],[3]]}`,
			Profile{Model: "e", PromptTokens: 3, OutputTokens: 0}},
		{"other path, not JSON: headers only", nil, "/v1/audio/transcriptions", "--boundary\r\n...",
			Profile{OutputTokens: 256}},
		{"other path, empty body", nil, "/v1/models", "",
			Profile{OutputTokens: 256}},
		{"other path, bad fields tolerated", nil, "/v1/rerank", `{"model":"m","messages":"x","max_tokens":-5}`,
			Profile{Model: "m", OutputTokens: 256}},
		{"zero config takes defaults", func(c *Config) { *c = Config{} }, chatPath, chat + `}`,
			Profile{Model: "m", PrefixKey: md5hex("You are terse."), PromptTokens: tokenize.CountText(rendered), OutputTokens: 256}},
		{"invalid UTF-8 in content is no error", nil, chatPath, "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"a\xffb\"}]}",
			Profile{Model: "m", PrefixKey: md5hex("a\uFFFDb"), PromptTokens: tokenize.CountText(tokenize.RenderChat([]tokenize.Message{{Role: "system", Content: "a\uFFFDb"}})), OutputTokens: 256}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			p, err := Parse(cfg, tt.path, http.Header{}, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, p); diff != "" {
				t.Errorf("profile mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
