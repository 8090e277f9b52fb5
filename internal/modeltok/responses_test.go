package modeltok

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/testutil/qwentok"
)

// responsesCase is a Responses API request (its prompt's fields) and the
// chat completion vLLM renders it as.
type responsesCase struct {
	name                                  string
	input, instructions, tools, reasoning string
	kwargs                                string
	chatMessages, chatTools, chatEffort   string
}

var weatherTool = `{"type": "function", "name": "get_weather", "description": "Weather of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}`
var weatherChatTool = `{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city.", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}`

var responsesCases = []responsesCase{
	{name: "string input",
		input:        `"Hello there"`,
		chatMessages: `[{"role": "user", "content": "Hello there"}]`},
	{name: "instructions",
		input: `"Hello"`, instructions: `"Be brief."`,
		chatMessages: `[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]`},
	{name: "empty instructions left out",
		input: `"Hello"`, instructions: `""`,
		chatMessages: `[{"role": "user", "content": "Hello"}]`},
	{name: "multi-turn items",
		input: `[{"role": "user", "content": "Hi"},
			{"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": [{"type": "output_text", "text": "Hello! How can I help?", "annotations": []}]},
			{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Tell me"}, {"type": "input_text", "text": "a joke"}]}]`,
		instructions: `"You are funny."`,
		chatMessages: `[{"role": "system", "content": "You are funny."}, {"role": "user", "content": "Hi"},
			{"role": "assistant", "content": "Hello! How can I help?"},
			{"role": "user", "content": [{"type": "text", "text": "Tell me"}, {"type": "text", "text": "a joke"}]}]`},
	{name: "assistant's first part only",
		input:        `[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": [{"type": "output_text", "text": "one"}, {"type": "output_text", "text": "two"}]}, {"role": "user", "content": "and?"}]`,
		chatMessages: `[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "one"}, {"role": "user", "content": "and?"}]`},
	{name: "developer message",
		input:        `[{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]`,
		chatMessages: `[{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}]`},
	{name: "function call and output",
		input: `[{"role": "user", "content": "Weather in Paris?"},
			{"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
			{"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C"}]`,
		tools: `[` + weatherTool + `]`,
		chatMessages: `[{"role": "user", "content": "Weather in Paris?"},
			{"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
			{"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]`,
		chatTools: `[` + weatherChatTool + `]`},
	{name: "parallel calls, text before, answer after",
		input: `[{"role": "user", "content": "Paris and Rome?"},
			{"role": "assistant", "content": "Let me look."},
			{"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
			{"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"},
			{"type": "function_call_output", "call_id": "call_1", "output": [{"type": "input_text", "text": "Sunny"}]},
			{"type": "function_call_output", "call_id": "call_2", "output": "Rain"},
			{"type": "function_call", "call_id": "call_3", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
			{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking Oslo too."}]},
			{"type": "function_call_output", "call_id": "call_3", "output": "Snow"},
			{"role": "user", "content": "Thanks"}]`,
		tools: `[` + weatherTool + `, {"type": "web_search"}]`,
		chatMessages: `[{"role": "user", "content": "Paris and Rome?"},
			{"role": "assistant", "content": "Let me look.", "tool_calls": [
				{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
				{"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
			{"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "Sunny"}]},
			{"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
			{"role": "assistant", "content": "Checking Oslo too.", "tool_calls": [
				{"id": "call_3", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
			{"role": "tool", "tool_call_id": "call_3", "content": "Snow"},
			{"role": "user", "content": "Thanks"}]`,
		chatTools: `[` + weatherChatTool + `]`},
	{name: "namespaced call",
		input:        `[{"role": "user", "content": "x"}, {"type": "function_call", "call_id": "c", "namespace": "mcp", "name": "read", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c", "output": "y"}]`,
		chatMessages: `[{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "mcp__read", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "y"}]`},
	{name: "strict tool",
		input:        `"Weather?"`,
		tools:        `[{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}, "strict": true}]`,
		chatMessages: `[{"role": "user", "content": "Weather?"}]`,
		chatTools:    `[{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}, "strict": true}}]`},
	{name: "no tools",
		input: `"Hi"`, tools: `[]`,
		chatMessages: `[{"role": "user", "content": "Hi"}]`},
	{name: "reasoning effort and template arguments",
		input: `"Hi"`, reasoning: `{"effort": "low", "summary": "auto"}`, kwargs: `{"enable_thinking": false}`,
		chatMessages: `[{"role": "user", "content": "Hi"}]`, chatEffort: `"low"`},
	{name: "reasoning without effort",
		input: `"Hi"`, reasoning: `{"summary": "auto"}`,
		chatMessages: `[{"role": "user", "content": "Hi"}]`},
}

func raw(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

// TestResponsesRenderAsTheirChat: a Responses API request renders as the
// chat completion vLLM turns it into.
func TestResponsesRenderAsTheirChat(t *testing.T) {
	m, err := Load(qwentok.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range responsesCases {
		t.Run(c.name, func(t *testing.T) {
			got, err := m.ChatRequestTokens(request.ChatRequest{Responses: true, Input: raw(c.input),
				Instructions: raw(c.instructions), Tools: raw(c.tools), Reasoning: raw(c.reasoning), TemplateKwargs: raw(c.kwargs)})
			if err != nil {
				t.Fatal(err)
			}
			want, err := m.ChatRequestTokens(request.ChatRequest{Messages: raw(c.chatMessages), Tools: raw(c.chatTools),
				ReasoningEffort: raw(c.chatEffort), TemplateKwargs: raw(c.kwargs)})
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Fatalf("%d tokens, the chat's %d: they differ from token %d", len(got), len(want), i)
			}
		})
	}
}

func TestResponsesRefused(t *testing.T) {
	m, err := Load(qwentok.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	user := `{"role": "user", "content": "Hi"}`
	for _, c := range []struct{ name, input, instructions, tools, reasoning string }{
		{name: "no input"},
		{name: "input null", input: `null`},
		{name: "input a number", input: `7`},
		{name: "no items", input: `[]`, instructions: `"x"`},
		{name: "instructions not a string", input: `"Hi"`, instructions: `["x"]`},
		{name: "reasoning item", input: `[` + user + `, {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}, {"role": "assistant", "content": "x"}, ` + user + `]`},
		{name: "encrypted reasoning", input: `[` + user + `, {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]`},
		{name: "item reference", input: `[{"type": "item_reference", "id": "msg_1"}, ` + user + `]`},
		{name: "built-in tool call", input: `[` + user + `, {"type": "web_search_call", "id": "ws_1", "status": "completed"}]`},
		{name: "image", input: `[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]`},
		{name: "file", input: `[{"role": "user", "content": [{"type": "input_text", "text": "read"}, {"type": "input_file", "file_id": "f"}]}]`},
		{name: "refusal", input: `[` + user + `, {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, ` + user + `]`},
		{name: "text part of the chat API", input: `[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]`},
		{name: "last message in progress", input: `[` + user + `, {"type": "message", "role": "assistant", "status": "in_progress", "content": [{"type": "output_text", "text": "Once"}]}]`},
		{name: "last message incomplete", input: `[{"role": "user", "status": "incomplete", "content": "Hi"}]`},
		{name: "tool role", input: `[{"role": "tool", "content": "x"}]`},
		{name: "no role", input: `[{"content": "x"}]`},
		{name: "call without call_id", input: `[` + user + `, {"type": "function_call", "name": "f", "arguments": "{}"}]`},
		{name: "call with object arguments", input: `[` + user + `, {"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]`},
		{name: "output without call_id", input: `[` + user + `, {"type": "function_call_output", "output": "x"}]`},
		{name: "output image", input: `[` + user + `, {"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image", "image_url": "x"}]}]`},
		{name: "item not an object", input: `["Hi"]`},
		{name: "type not a string", input: `[{"type": 1, "role": "user", "content": "x"}]`},
		{name: "namespace tool", input: `"Hi"`, tools: `[{"type": "namespace", "name": "mcp", "tools": [` + weatherTool + `]}]`},
		{name: "no function tool", input: `"Hi"`, tools: `[{"type": "web_search"}]`},
		{name: "tool without type", input: `"Hi"`, tools: `[{"name": "f", "description": "d"}]`},
		{name: "tool without description", input: `"Hi"`, tools: `[{"type": "function", "name": "f", "parameters": {}}]`},
		{name: "deferred tool", input: `"Hi"`, tools: `[{"type": "function", "name": "f", "description": "d", "defer_loading": true}]`},
		{name: "tools not a list", input: `"Hi"`, tools: `{"type": "function"}`},
		{name: "effort not a string", input: `"Hi"`, reasoning: `{"effort": 3}`},
		{name: "reasoning not an object", input: `"Hi"`, reasoning: `"low"`},
	} {
		req := request.ChatRequest{Responses: true, Input: raw(c.input), Instructions: raw(c.instructions),
			Tools: raw(c.tools), Reasoning: raw(c.reasoning)}
		if _, err := m.ChatRequestTokens(req); !errors.Is(err, ErrNotRendered) {
			t.Errorf("%s: err %v, want ErrNotRendered", c.name, err)
		}
	}
}

// FuzzResponsesChatRequestTokens: whatever the input, instructions,
// tools and reasoning, a Responses API request renders to tokens or an
// error, never a panic.
func FuzzResponsesChatRequestTokens(f *testing.F) {
	for _, c := range responsesCases {
		f.Add([]byte(c.input), []byte(c.instructions), []byte(c.tools), []byte(c.reasoning))
	}
	data, err := os.ReadFile(filepath.Join("testdata", "responses_chats.json"))
	if err != nil {
		f.Fatal(err)
	}
	var reqs []struct{ Input, Instructions, Tools, Reasoning json.RawMessage }
	if err := json.Unmarshal(data, &reqs); err != nil {
		f.Fatal(err)
	}
	for _, r := range reqs {
		f.Add([]byte(r.Input), []byte(r.Instructions), []byte(r.Tools), []byte(r.Reasoning))
	}
	f.Add([]byte(`[{"type":"function_call","call_id":"c","name":"f","arguments":"{"},{"type":"function_call_output","call_id":"c","output":[]}]`), []byte(`null`), []byte(`[{"type":"function","name":"f","description":"d","parameters":{"a":null}}]`), []byte(`{"effort":null}`))
	f.Add([]byte(`[{"role":"assistant","content":[]},{"type":"message","role":"user","content":[{"type":"input_text","text":"\u00e9"}]}]`), []byte(`"\ud800"`), []byte(`[{"type":"function","name":"f","description":"d","strict":}]`), []byte(`{}`))
	m, err := Load(qwentok.Dir(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, input, instructions, tools, reasoning []byte) {
		ids, err := m.ChatRequestTokens(request.ChatRequest{Responses: true, Input: input, Instructions: instructions,
			Tools: tools, Reasoning: reasoning})
		if err == nil && len(ids) == 0 {
			t.Fatal("no error and no tokens")
		}
		if err != nil && !errors.Is(err, ErrNotRendered) {
			// The template may refuse a conversation (an error of its
			// own); what the conversion reads is refused as not rendered.
			if _, cerr := responsesChat(request.ChatRequest{Responses: true, Input: input, Instructions: instructions,
				Tools: tools, Reasoning: reasoning}); cerr != nil {
				t.Fatalf("conversion error not ErrNotRendered: %v", cerr)
			}
		}
	})
}
