package modeltok

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/llmlb/llmlb/internal/hftok"
	"github.com/llmlb/llmlb/internal/jsontop"
)

// ErrNotRendered is returned for a chat request whose prompt llmlb does
// not render as vLLM does (see vllmConversation); the caller hashes the
// prompt's text instead.
var ErrNotRendered = errors.New("modeltok: a chat llmlb does not render as vLLM does")

// ChatRequestTokens renders a chat completion's messages and tools (the
// request's raw JSON values; tools may be nil) as vLLM renders them
// (vllmConversation), with the model's chat template and the generation
// prompt, and tokenizes the result without adding special tokens.
func (m *Model) ChatRequestTokens(messages, tools json.RawMessage) ([]uint32, error) {
	if m.chat == nil {
		return nil, ErrNoChatTemplate
	}
	conv, toolDicts, err := vllmConversation(messages, tools)
	if err != nil {
		return nil, err
	}
	text, err := m.chat.RenderJSON(conv, toolDicts)
	if err != nil {
		return nil, err
	}
	return m.tok.Encode(text)
}

// wireMessage is the part of an OpenAI chat message vLLM passes to the
// chat template.
type wireMessage struct {
	Role             json.RawMessage `json:"role"`
	Content          json.RawMessage `json:"content"`
	Name             json.RawMessage `json:"name"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
	ToolCallID       json.RawMessage `json:"tool_call_id"`
	Tools            json.RawMessage `json:"tools"`
	Reasoning        json.RawMessage `json:"reasoning"`
	ReasoningContent json.RawMessage `json:"reasoning_content"`
	Task             json.RawMessage `json:"task"`
}

type wireToolCall struct {
	ID       json.RawMessage `json:"id"`
	Type     json.RawMessage `json:"type"`
	Function struct {
		Name      json.RawMessage `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type wireTool struct {
	Type         json.RawMessage `json:"type"`
	DeferLoading json.RawMessage `json:"defer_loading"`
	Function     *struct {
		Name         json.RawMessage `json:"name"`
		Description  json.RawMessage `json:"description"`
		Parameters   json.RawMessage `json:"parameters"`
		Strict       json.RawMessage `json:"strict"`
		DeferLoading json.RawMessage `json:"defer_loading"`
	} `json:"function"`
}

// vllmConversation turns a chat completion's messages and tools into the
// conversation and tool dicts vLLM hands to transformers'
// apply_chat_template (vllm/entrypoints/chat_utils.py and the chat
// protocol's serializers), as JSON whose objects keep the order Python's
// dicts would have:
//   - each message as {role, content: its text parts joined by newlines
//     (the "string" content format), tool_calls (an assistant's, each
//     {id, function: {arguments, name}, type} with arguments read from
//     their JSON string, {} when that is not JSON; an empty list
//     dropped), tool_call_id (a tool message's), name (when a string),
//     tools (a developer message's, null when absent)};
//   - each tool as {type, function: {name, description, parameters,
//     strict when set}}, description and parameters null when absent.
//
// What vLLM renders differently from release to release, or from data
// llmlb does not see, or what the template engine would print unlike
// Jinja2 (printable; a tool without a description), is refused with
// ErrNotRendered: reasoning fields
// (read as "reasoning" or as "reasoning_content" depending on the
// release), content parts other than text, tools other than functions,
// deferred tools, a model-specific task.
func vllmConversation(messages, tools json.RawMessage) (conv, toolDicts []byte, err error) {
	var b bytes.Buffer
	b.Grow(len(messages) + 256)
	b.WriteByte('[')
	i := 0
	ok := jsontop.Elements(messages, func(raw []byte) bool {
		var m wireMessage
		if !jsontop.Members(raw, m.set) {
			err = errors.New("not an object")
		} else {
			if i > 0 {
				b.WriteString(", ")
			}
			err = writeMessage(&b, &m)
		}
		if err != nil {
			err = fmt.Errorf("%w: messages[%d]: %v", ErrNotRendered, i, err)
			return false
		}
		i++
		return true
	})
	if !ok {
		return nil, nil, cmp.Or(err, fmt.Errorf("%w: messages is not an array", ErrNotRendered))
	}
	b.WriteByte(']')
	conv = b.Bytes()
	if isNull(tools) {
		return conv, nil, nil
	}
	var ts []wireTool
	if err := json.Unmarshal(tools, &ts); err != nil {
		return nil, nil, fmt.Errorf("%w: tools: %v", ErrNotRendered, err)
	}
	var t bytes.Buffer
	t.WriteByte('[')
	for i := range ts {
		if i > 0 {
			t.WriteString(", ")
		}
		if err := writeTool(&t, &ts[i]); err != nil {
			return nil, nil, fmt.Errorf("%w: tools[%d]: %v", ErrNotRendered, i, err)
		}
	}
	t.WriteByte(']')
	return conv, t.Bytes(), nil
}

// set records one member of a message object (jsontop.Members): keys are
// matched exactly, as pydantic matches them.
func (m *wireMessage) set(key, value []byte) bool {
	switch string(key) {
	case "role":
		m.Role = value
	case "content":
		m.Content = value
	case "name":
		m.Name = value
	case "tool_calls":
		m.ToolCalls = value
	case "tool_call_id":
		m.ToolCallID = value
	case "tools":
		m.Tools = value
	case "reasoning":
		m.Reasoning = value
	case "reasoning_content":
		m.ReasoningContent = value
	case "task":
		m.Task = value
	}
	return true
}

func writeMessage(b *bytes.Buffer, m *wireMessage) error {
	var role string
	if err := json.Unmarshal(m.Role, &role); err != nil || role == "" {
		return errors.New("no role")
	}
	for _, f := range []json.RawMessage{m.Reasoning, m.ReasoningContent, m.Task} {
		if !isNull(f) {
			return errors.New("reasoning or a task")
		}
	}
	b.WriteString(`{"role": `)
	b.Write(m.Role)
	b.WriteString(`, "content": `)
	if len(m.Content) > 0 && m.Content[0] == '"' {
		b.Write(m.Content) // a string, as it came
	} else {
		text, err := contentText(m.Content)
		if err != nil {
			return err
		}
		writeString(b, text)
	}
	switch role {
	case "assistant":
		if !isNull(m.ToolCalls) {
			if err := writeToolCalls(b, m.ToolCalls); err != nil {
				return err
			}
		}
	case "tool":
		if m.ToolCallID != nil { // present, even as null
			b.WriteString(`, "tool_call_id": `)
			b.Write(m.ToolCallID)
		}
	}
	if len(m.Name) > 0 && m.Name[0] == '"' {
		b.WriteString(`, "name": `)
		b.Write(m.Name)
	}
	if role == "developer" {
		b.WriteString(`, "tools": `)
		if m.Tools == nil {
			b.WriteString("null")
		} else {
			b.Write(m.Tools)
		}
	}
	b.WriteByte('}')
	return nil
}

// contentText is a message's content in the "string" format: a string, or
// its text parts joined by newlines (null: empty).
func contentText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var parts []struct {
		Type string           `json:"type"`
		Text *json.RawMessage `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content is neither a string nor an array of parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("a %q content part", p.Type)
		}
		if p.Text == nil || isNull(*p.Text) {
			continue // vLLM skips a text part without text
		}
		var s string
		if err := json.Unmarshal(*p.Text, &s); err != nil {
			return "", errors.New("a text part's text is not a string")
		}
		texts = append(texts, s)
	}
	return strings.Join(texts, "\n"), nil
}

func writeToolCalls(b *bytes.Buffer, raw json.RawMessage) error {
	var calls []wireToolCall
	if err := json.Unmarshal(raw, &calls); err != nil {
		return errors.New("tool_calls is not an array of tool calls")
	}
	if len(calls) == 0 {
		return nil // vLLM drops an empty list
	}
	b.WriteString(`, "tool_calls": [`)
	for i, c := range calls {
		if i > 0 {
			b.WriteString(", ")
		}
		if c.ID == nil || c.Function.Name == nil {
			return errors.New("a tool call without id or function name")
		}
		if t := string(c.Type); t != "" && t != `"function"` {
			return fmt.Errorf("a tool call of type %s", t)
		}
		args := toolArguments(c.Function.Arguments)
		if err := printable(args); err != nil {
			return fmt.Errorf("tool call arguments: %w", err)
		}
		b.WriteString(`{"id": `)
		b.Write(c.ID)
		b.WriteString(`, "function": {"arguments": `)
		b.Write(args)
		b.WriteString(`, "name": `)
		b.Write(c.Function.Name)
		b.WriteString(`}, "type": "function"}`)
	}
	b.WriteByte(']')
	return nil
}

// toolArguments is what vLLM makes of a tool call's arguments: a JSON
// string read as JSON ({} when it is not), an object or array as it is,
// anything else {}.
func toolArguments(raw json.RawMessage) []byte {
	switch {
	case len(raw) == 0:
		return []byte("{}")
	case raw[0] == '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if t := bytes.TrimSpace([]byte(s)); len(t) > 0 && json.Valid(t) {
				return t
			}
		}
		return []byte("{}")
	case raw[0] == '{' || raw[0] == '[':
		return raw
	}
	return []byte("{}")
}

func writeTool(b *bytes.Buffer, t *wireTool) error {
	if t.Function == nil || t.Function.Name == nil || t.Function.Name[0] != '"' {
		return errors.New("not a function with a name")
	}
	if typ := string(t.Type); typ != "" && typ != `"function"` {
		return fmt.Errorf("a tool of type %s", typ)
	}
	if !isNull(t.DeferLoading) || !isNull(t.Function.DeferLoading) {
		return errors.New("a deferred tool")
	}
	f := t.Function
	if isNull(f.Description) {
		return errors.New("no description (printed as None by templates that print it)")
	}
	if err := printable(f.Parameters); err != nil {
		return fmt.Errorf("parameters: %w", err)
	}
	b.WriteString(`{"type": "function", "function": {"name": `)
	b.Write(f.Name)
	b.WriteString(`, "description": `)
	b.Write(orNull(f.Description))
	b.WriteString(`, "parameters": `)
	b.Write(orNull(f.Parameters))
	if !isNull(f.Strict) {
		b.WriteString(`, "strict": `)
		b.Write(f.Strict)
	}
	b.WriteString(`}}`)
	return nil
}

func orNull(raw json.RawMessage) []byte {
	if len(raw) == 0 {
		return []byte("null")
	}
	return raw
}

func writeString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s) // escapes only: the result is read back as JSON
	b.Write(q)
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// printable reports an error for a JSON value holding what the template
// engine prints unlike Jinja2 (templates print tool parameters and
// arguments as text as well as in JSON): a null (Python prints None, the
// engine nothing) or a float whose Python form is not Go's %g (2.0 printed
// as 2, 1234567.0 as 1.234567e+06).
func printable(raw json.RawMessage) error {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch t := tok.(type) {
		case nil:
			return errors.New("a null")
		case json.Number:
			if s := string(t); strings.ContainsAny(s, ".eE") {
				f, err := strconv.ParseFloat(s, 64)
				if err != nil || hftok.PythonFloat(f) != fmt.Sprintf("%g", f) {
					return fmt.Errorf("the float %s", s)
				}
			}
		}
	}
}
