package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAppendEventAndDone(t *testing.T) {
	if got := string(AppendEvent([]byte("x"), []byte(`{"a":1}`))); got != "xdata: {\"a\":1}\n\n" {
		t.Errorf("AppendEvent = %q", got)
	}
	if !EndsWithDone([]byte(DoneEvent)) {
		t.Errorf("DoneEvent does not end with [DONE]")
	}
}

func TestEndsWithDone(t *testing.T) {
	cases := []struct {
		tail string
		want bool
	}{
		{"data: [DONE]\n\n", true},
		{"}\n\ndata: [DONE]", true},
		{"data:[DONE]\r\n\r\n", true},
		{"data:   [DONE] \n", true},
		{"data: [DONE]x\n\n", false},
		{"[DONE]\n\n", false},
		{"data: {\"x\":\"[DONE]\"}\n\n", false},
		{"data: {}\n\n", false},
		{"", false},
	}
	for _, c := range cases {
		if got := EndsWithDone([]byte(c.tail)); got != c.want {
			t.Errorf("EndsWithDone(%q) = %v, want %v", c.tail, got, c.want)
		}
	}
}

func TestAskUsage(t *testing.T) {
	cases := []struct {
		name, body string
		asked      bool
	}{
		{"object", `{"model":"m","stream":true}`, true},
		{"leading space", ` {"model":"m"}`, true},
		{"newline after brace", "{\n\"model\":\"m\"}", true},
		{"has stream_options", `{"model":"m","stream_options":{"include_usage":false}}`, false},
		{"stream_options as a value", `{"messages":[{"content":"stream_options"}]}`, false},
		{"escaped in a string", `{"messages":[{"content":"\"stream_options\""}]}`, true},
		{"empty object", `{ }`, false},
		{"not an object", `x{"model":"m"}`, false},
		{"no brace", `[]`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, asked := AskUsage([]byte(c.body))
			if asked != c.asked {
				t.Fatalf("asked = %v, want %v (%s)", asked, c.asked, out)
			}
			if !asked {
				if string(out) != c.body {
					t.Fatalf("body changed: %s", out)
				}
				return
			}
			var m map[string]json.RawMessage
			if err := json.Unmarshal(out, &m); err != nil {
				t.Fatalf("invalid JSON %s: %v", out, err)
			}
			if string(m["stream_options"]) != `{"include_usage":true}` {
				t.Fatalf("body %s", out)
			}
		})
	}
}

func TestUsageReaderLine(t *testing.T) {
	cases := []struct {
		name, model string
		lines       []string
		usage       TokenCounts
		token       bool
		usageOnly   []bool
	}{
		{
			name: "chat stream with usage chunk",
			lines: []string{
				`data: {"model":"m","choices":[{"delta":{"role":"assistant","content":""}}]}`,
				`data: {"model":"m","choices":[{"delta":{"content":"Hi"}}],"usage":null}`,
				`data: {"model":"m","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":96}}}` + "\r",
				`data: [DONE]`,
			},
			model: "m", usage: TokenCounts{PromptTokens: 120, CachedTokens: 96, CompletionTokens: 2, CachedReported: true}, token: true,
			usageOnly: []bool{false, false, true, false},
		},
		{
			name:      "role-only chunk is no token",
			lines:     []string{`data: {"model":"m","choices":[{"delta":{"role":"assistant"}}]}`},
			model:     "m",
			usageOnly: []bool{false},
		},
		{
			name:      "reasoning is a token",
			lines:     []string{`data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}`},
			token:     true,
			usageOnly: []bool{false},
		},
		{
			name:      "tool call is a token",
			lines:     []string{`data: {"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}`},
			token:     true,
			usageOnly: []bool{false},
		},
		{
			name:      "empty tool calls are no token",
			lines:     []string{`data: {"choices":[{"delta":{"tool_calls":[]}}]}`, `data: {"choices":[{"delta":{"tool_calls":null}}]}`},
			usageOnly: []bool{false, false},
		},
		{
			name:      "completions text is a token",
			lines:     []string{`data:{"model":"c","choices":[{"text":"x"}]}`},
			model:     "c",
			token:     true,
			usageOnly: []bool{false},
		},
		{
			name: "usage with choices is not usage-only",
			lines: []string{
				`data: {"model":"m","choices":[{"text":"x"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
			},
			model: "m", usage: TokenCounts{PromptTokens: 3, CompletionTokens: 1}, token: true,
			usageOnly: []bool{false},
		},
		{
			name: "not data lines",
			lines: []string{
				`event: message`, `: comment`, `id: 1`, ``, `data: `, `data: "x"`, `data: {not json`,
			},
			usageOnly: []bool{false, false, false, false, false, false, false},
		},
		{
			name: "the first model stays",
			lines: []string{
				`data: {"model":"a","choices":[]}`, `data: {"model":"b","choices":[]}`,
			},
			model: "a", usageOnly: []bool{false, false},
		},
		{
			name: "a usage of the wrong type is not read",
			lines: []string{
				`data: {"model":"m","choices":[],"usage":{"prompt_tokens":"3"}}`,
			},
			usageOnly: []bool{false},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r UsageReader
			for i, l := range c.lines {
				if got := r.Line([]byte(l)); got != c.usageOnly[i] {
					t.Errorf("Line(%q) usage-only = %v, want %v", l, got, c.usageOnly[i])
				}
			}
			if r.Model != c.model || r.Usage != c.usage || r.Token != c.token {
				t.Errorf("model %q usage %+v token %v, want %q %+v %v", r.Model, r.Usage, r.Token, c.model, c.usage, c.token)
			}
		})
	}
}

// TestUsageReaderStream: lines split across pieces are joined, and a line
// over MaxSSELine is dropped unread.
func TestUsageReaderStream(t *testing.T) {
	stream := `data: {"model":"m","choices":[{"delta":{"content":"a"}}]}` + "\n\n" +
		`data: {"model":"m","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}` + "\n\n" + DoneEvent
	cases := []struct {
		name  string
		split []int // piece sizes; the rest goes in a last piece
	}{
		{"whole", nil},
		{"bytewise", repeat(1, len(stream))},
		{"mid line", []int{20, 50, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r UsageReader
			rest := []byte(stream)
			for _, n := range c.split {
				r.Stream(rest[:n])
				rest = rest[n:]
			}
			r.Stream(rest)
			if r.Model != "m" || !r.Token || r.Usage != (TokenCounts{PromptTokens: 9, CompletionTokens: 4}) {
				t.Errorf("model %q token %v usage %+v", r.Model, r.Token, r.Usage)
			}
		})
	}
	var r UsageReader
	r.Stream([]byte(`data: {"model":"long","x":"` + strings.Repeat("x", MaxSSELine)))
	r.Stream([]byte("\"}\n" + `data: {"model":"short","choices":[]}` + "\n"))
	if r.Model != "short" {
		t.Errorf("model %q after an overlong line, want short", r.Model)
	}
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func TestUsageReaderBody(t *testing.T) {
	cases := []struct {
		name, model string
		pieces      []string
		usage       TokenCounts
	}{
		{"completion", "m", []string{`{"model":"m","choices":[{"message":{"content":"hi"}}],`, `"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}`}, TokenCounts{PromptTokens: 7, CompletionTokens: 3}},
		{"cached tokens", "m", []string{`{"model":"m","usage":{"prompt_tokens":7,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":5}}}`}, TokenCounts{PromptTokens: 7, CachedTokens: 5, CompletionTokens: 3, CachedReported: true}},
		{"a malformed total is not read", "m", []string{`{"model":"m","usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":"x"}}`}, TokenCounts{PromptTokens: 7, CompletionTokens: 3}},
		{"no usage", "m", []string{`{"model":"m"}`}, TokenCounts{}},
		{"invalid", "", []string{`{"model":`}, TokenCounts{}},
		{"empty", "", nil, TokenCounts{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r UsageReader
			for _, p := range c.pieces {
				r.Body([]byte(p))
			}
			r.Finish()
			if r.Model != c.model || r.Usage != c.usage || r.Token {
				t.Errorf("model %q usage %+v token %v, want %q %+v", r.Model, r.Usage, r.Token, c.model, c.usage)
			}
		})
	}
	var r UsageReader
	r.Body([]byte(`{"model":"m","usage":{"prompt_tokens":1},"pad":"`))
	r.Body(make([]byte, MaxJSONBody))
	r.Finish()
	if r.Model != "" || r.Usage != (TokenCounts{}) {
		t.Errorf("an answer over MaxJSONBody was read: %q %+v", r.Model, r.Usage)
	}
}

func TestNewUsage(t *testing.T) {
	got := string(jsonLine(NewUsage(10, 4, 6)))
	want := `{"prompt_tokens":10,"total_tokens":14,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":6}}` + "\n"
	if got != want {
		t.Errorf("NewUsage encodes as %s, want %s", got, want)
	}
	if got := string(jsonLine(Usage{PromptTokens: 1})); got != `{"prompt_tokens":1,"total_tokens":0,"completion_tokens":0}`+"\n" {
		t.Errorf("Usage without details encodes as %s", got)
	}
}

func TestWithPriority(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"model":"m"}`, `{"model":"m","priority":-5}`},
		{"{\"model\":\"m\",\"priority\":-99}\n", "{\"model\":\"m\",\"priority\":-99,\"priority\":-5}\n"},
		{`{ }`, `{ "priority":-5}`},
		{`[1]`, `[1]`},
		{``, ``},
	} {
		got := string(WithPriority([]byte(tc.in), -5))
		if got != tc.want {
			t.Errorf("WithPriority(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if tc.in != "" && tc.in[0] == '{' {
			var v struct{ Priority int }
			if err := json.Unmarshal([]byte(got), &v); err != nil || v.Priority != -5 {
				t.Errorf("WithPriority(%q) decodes to priority %d (%v), want -5: the last member wins", tc.in, v.Priority, err)
			}
		}
	}
}
