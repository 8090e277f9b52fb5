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

func TestParseSessionKey(t *testing.T) {
	long := strings.Repeat("k", 300)
	tests := []struct {
		name   string
		cfg    func(*Config)
		header http.Header
		body   string
		want   string
	}{
		{"none", nil, nil, `{"model":"m"}`, ""},
		{"x-session-id", nil, hdr("X-Session-Id", "s1"), `{"model":"m"}`, "s1"},
		{"header names are case-insensitive", nil, hdr("x-claude-code-session-id", "cc"), `{"model":"m"}`, "cc"},
		{"header list order wins", nil, hdr("Thread-Id", "t", "X-Kilocode-Taskid", "kilo"), `{"model":"m"}`, "kilo"},
		{"every default header: cursor", nil, hdr("X-Cursor-Conversation-Id", "cur"), `{"model":"m"}`, "cur"},
		{"every default header: helicone", nil, hdr("Helicone-Session-Id", "he"), `{"model":"m"}`, "he"},
		{"every default header: session-id", nil, hdr("Session-Id", "sid"), `{"model":"m"}`, "sid"},
		{"header beats body", nil, hdr("X-Session-Id", "h"), `{"model":"m","session_id":"b"}`, "h"},
		{"blank header skipped", nil, hdr("X-Session-Id", "  "), `{"model":"m","session_id":"b"}`, "b"},
		{"prompt_cache_key", nil, nil, `{"model":"m","prompt_cache_key":"pck","session_id":"s"}`, "pck"},
		{"conversation_id before thread_id", nil, nil, `{"model":"m","thread_id":"th","conversation_id":"conv"}`, "conv"},
		{"thread_id", nil, nil, `{"model":"m","thread_id":"th"}`, "th"},
		{"numeric session_id", nil, nil, `{"model":"m","session_id":12345}`, "12345"},
		{"object session_id ignored", nil, nil, `{"model":"m","session_id":{"a":1},"metadata":{"session_id":"ms"}}`, "ms"},
		{"metadata.session_id", nil, nil, `{"model":"m","metadata":{"session_id":"ms"}}`, "ms"},
		{"claude code user_id", nil, nil, `{"model":"m","metadata":{"user_id":"user_ab12_account_77_session_0b1c-2d"}}`, "session_0b1c-2d"},
		{"claude code JSON user_id", nil, nil, `{"model":"m","metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"9f\"}"}}`, "session_9f"},
		{"plain user_id is not a session", nil, nil, `{"model":"m","metadata":{"user_id":"alice"}}`, ""},
		{"metadata not an object", nil, nil, `{"model":"m","metadata":"x"}`, ""},
		{"control chars stripped (header injection)", nil, hdr("X-Session-Id", "abc\r\nX-Evil: 1"), `{"model":"m"}`, "abcX-Evil: 1"},
		{"control chars stripped in body", nil, nil, `{"model":"m","session_id":"a\u0000b\u001bc\u202ed"}`, "abcd"},
		{"invalid UTF-8 dropped", nil, hdr("X-Session-Id", "ab\xffcd"), `{"model":"m"}`, "abcd"},
		{"unicode kept", nil, hdr("X-Session-Id", "сессия-1"), `{"model":"m"}`, "сессия-1"},
		{"only control chars: next source", nil, hdr("X-Session-Id", "\x01\x02"), `{"model":"m","session_id":"b"}`, "b"},
		{"long key hashed", nil, hdr("X-Session-Id", long), `{"model":"m"}`, "sha256:" + sha256hex(long)},
		{"custom header list", func(c *Config) { c.SessionHeaders = []string{"X-User-Session"} }, hdr("X-User-Session", "u", "X-Session-Id", "s"), `{"model":"m"}`, "u"},
		{"custom body path", func(c *Config) { c.SessionBodyFields = []string{"extra.deep.sid"} }, nil, `{"model":"m","extra":{"deep":{"sid":"d"}},"session_id":"s"}`, "d"},
		{"empty lists: no key", func(c *Config) { c.SessionHeaders, c.SessionBodyFields = nil, nil }, hdr("X-Session-Id", "s"), `{"model":"m","session_id":"s"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			p, err := Parse(cfg, chatPath, tt.header, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if p.SessionKey != tt.want {
				t.Errorf("SessionKey = %q, want %q", p.SessionKey, tt.want)
			}
		})
	}
}

func sha256hex(s string) string {
	return strings.TrimPrefix(sanitizeKey(s), "sha256:")
}

func TestSanitizeKeyHash(t *testing.T) {
	k := sanitizeKey(strings.Repeat("k", 300))
	if len(k) != len("sha256:")+32 || !strings.HasPrefix(k, "sha256:") {
		t.Errorf("long key = %q", k)
	}
	if sanitizeKey(strings.Repeat("k", 300)) == sanitizeKey(strings.Repeat("k", 301)) {
		t.Error("different long keys hash equal")
	}
	if k := sanitizeKey(strings.Repeat("k", MaxKeyBytes)); len(k) != MaxKeyBytes {
		t.Errorf("key of exactly MaxKeyBytes changed to %q", k)
	}
}

func TestParsePrefixKey(t *testing.T) {
	sys4096 := strings.Repeat("s", 4096)
	runes := strings.Repeat("é", 5000) // 2 bytes each
	tests := []struct {
		name   string
		path   string
		header http.Header
		body   string
		want   string
	}{
		{"no system prompt", chatPath, nil, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"system string", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`, md5hex("be brief")},
		{"developer role", chatPath, nil, `{"model":"m","messages":[{"role":"developer","content":"dev"}]}`, md5hex("dev")},
		{"system and developer joined", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"a"},{"role":"user","content":"u"},{"role":"developer","content":"b"}]}`, md5hex("a\nb")},
		{"content parts", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":[{"type":"text","text":"p1"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"p2"}]}]}`, md5hex("p1\np2")},
		{"empty system content", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":""}]}`, ""},
		{"null system content", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":null}]}`, ""},
		{"first 4096 chars only", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"` + sys4096 + `tail"}]}`, md5hex(sys4096)},
		{"characters, not bytes", chatPath, nil, `{"model":"m","messages":[{"role":"system","content":"` + runes + `"}]}`, md5hex(strings.Repeat("é", 4096))},
		{"tenant joined", chatPath, hdr("X-Project-Id", "acme"), `{"model":"m","messages":[{"role":"system","content":"be brief"}]}`, "acme:" + md5hex("be brief")},
		{"second tenant header", chatPath, hdr("X-Kilocode-Projectid", "kp"), `{"model":"m","messages":[{"role":"system","content":"be brief"}]}`, "kp:" + md5hex("be brief")},
		{"tenant alone makes no key", chatPath, hdr("X-Project-Id", "acme"), `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, ""},
		{"tenant sanitized", chatPath, hdr("X-Project-Id", "ac\nme"), `{"model":"m","messages":[{"role":"system","content":"x"}]}`, "acme:" + md5hex("x")},
		{"completions prompt", compPath, nil, `{"model":"m","prompt":"once upon"}`, md5hex("once upon")},
		{"completions prompt array", compPath, nil, `{"model":"m","prompt":["a","b"]}`, md5hex("a\nb")},
		{"completions token ids", compPath, nil, `{"model":"m","prompt":[1, 2, 3]}`, md5hex("[1,2,3]")},
		{"completions token batches", compPath, nil, `{"model":"m","prompt":[[1],[2,3]]}`, md5hex("[[1],[2,3]]")},
		{"completions no prompt", compPath, nil, `{"model":"m"}`, ""},
		{"embeddings have no prefix key", embPath, nil, `{"model":"m","input":"text"}`, ""},
		{"messages API top-level system", "/v1/messages", nil, `{"model":"m","system":[{"type":"text","text":"sys"}],"messages":[]}`, md5hex("sys")},
		{"responses API instructions", "/v1/responses", nil, `{"model":"m","instructions":"ins"}`, md5hex("ins")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Parse(DefaultConfig(), tt.path, tt.header, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if p.PrefixKey != tt.want {
				t.Errorf("PrefixKey = %q, want %q", p.PrefixKey, tt.want)
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

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		want string // "" = valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"empty lists", func(c *Config) { c.SessionHeaders, c.SessionBodyFields, c.TenantHeaders = nil, nil, nil }, ""},
		{"bad session header", func(c *Config) { c.SessionHeaders = []string{"x-ok", "x bad"} }, "request.session_headers[1]"},
		{"empty tenant header", func(c *Config) { c.TenantHeaders = []string{""} }, "request.tenant_headers[0]"},
		{"empty body field", func(c *Config) { c.SessionBodyFields = []string{""} }, "request.session_body_fields[0]"},
		{"bad dotted path", func(c *Config) { c.SessionBodyFields = []string{"metadata..id"} }, "request.session_body_fields[0]"},
		{"zero prefix chars", func(c *Config) { c.PrefixChars = 0 }, "request.prefix_chars"},
		{"negative default output", func(c *Config) { c.DefaultOutputTokens = -1 }, "request.default_output_tokens"},
	}
	for _, tt := range tests {
		cfg := DefaultConfig()
		tt.mod(&cfg)
		err := cfg.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: unexpected error %v", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "request: ")):
			t.Errorf("%s: error = %v, want one naming %s", tt.name, err, tt.want)
		}
	}
}

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
