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
	"github.com/llmlb/llmlb/internal/request"
)

// ErrNotRendered is returned for a chat request whose prompt llmlb does
// not render as vLLM does (see vllmConversation); the caller hashes the
// prompt's text instead.
var ErrNotRendered = errors.New("modeltok: a chat llmlb does not render as vLLM does")

// ChatRequestTokens renders a chat completion as vLLM renders it
// (vllmConversation, templateKwargs), with the model's chat template and
// the generation prompt, and tokenizes the result without adding special
// tokens. An Anthropic Messages or a Responses API request is first
// turned into the chat vLLM serves it as (anthropicChat, responsesChat).
func (m *Model) ChatRequestTokens(req request.ChatRequest) ([]uint32, error) {
	if m.chat == nil {
		return nil, ErrNoChatTemplate
	}
	var err error
	switch {
	case req.Anthropic:
		req, err = anthropicChat(req)
	case req.Responses:
		req, err = responsesChat(req)
	}
	if err != nil {
		return nil, err
	}
	chat := m.chat
	if !isNull(req.Tools) {
		chat = chat.ToolUse()
	}
	conv, toolDicts, err := vllmConversation(req.Messages, req.Tools, templateTraits{
		openai: chat.ContentFormat() == "openai", developer: chat.HandlesDeveloperRole()})
	if err != nil {
		return nil, err
	}
	kwargs, err := templateKwargs(req.TemplateKwargs, req.ReasoningEffort)
	if err != nil {
		return nil, err
	}
	text, err := m.chat.RenderWith(conv, toolDicts, kwargs)
	if err != nil {
		return nil, err
	}
	return m.tok.Encode(text)
}

// vllmDefaults are the template variables vLLM passes to every chat
// besides messages, tools and the generation prompt (the chat request's
// build_chat_params): templates that ask whether reasoning_effort is
// defined see it defined, as None.
const vllmDefaults = `{"continue_final_message": false, "reasoning_effort": null}`

// reservedKwargs are chat_template_kwargs keys that would override what
// vLLM sets itself or refuses: a request with one is not rendered.
var reservedKwargs = map[string]bool{
	"messages": true, "conversation": true, "tools": true, "documents": true, "chat_template": true,
	"tokenize": true, "add_generation_prompt": true, "continue_final_message": true, "reasoning_effort": true,
}

// templateKwargs is the JSON object of template variables vLLM adds for a
// request: its chat_template_kwargs, then reasoning_effort, and
// enable_thinking (false for "none") when reasoning_effort is set and the
// kwargs do not say it; nil when there are none.
func templateKwargs(kwargs, effort json.RawMessage) ([]byte, error) {
	if isNull(kwargs) && isNull(effort) {
		return nil, nil
	}
	var b bytes.Buffer
	b.WriteByte('{')
	thinking := false
	if !isNull(kwargs) {
		ok := jsontop.Members(kwargs, func(k, v []byte) bool {
			if reservedKwargs[string(k)] {
				return false
			}
			thinking = thinking || string(k) == "enable_thinking"
			if b.Len() > 1 {
				b.WriteString(", ")
			}
			writeString(&b, string(k))
			b.WriteString(": ")
			b.Write(v)
			return true
		})
		if !ok {
			return nil, fmt.Errorf("%w: chat_template_kwargs is not an object of variables llmlb passes on", ErrNotRendered)
		}
	}
	if !isNull(effort) {
		var e string
		if err := json.Unmarshal(effort, &e); err != nil {
			return nil, fmt.Errorf("%w: reasoning_effort is not a string", ErrNotRendered)
		}
		if b.Len() > 1 {
			b.WriteString(", ")
		}
		b.WriteString(`"reasoning_effort": `)
		b.Write(effort)
		if !thinking {
			fmt.Fprintf(&b, `, "enable_thinking": %t`, e != "none")
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
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
// apply_chat_template (vllm/entrypoints/chat_utils.py, its renderer and
// the chat protocol's serializers), as JSON whose objects keep the order
// Python's dicts would have. tmpl says how the template takes content
// (hftok.ChatTemplate's ContentFormat) and whether it knows the developer
// role.
//   - each message as {role, content, tool_calls (an assistant's, each
//     {id, function: {arguments, name}, type} with arguments read from
//     their JSON string, {} when that is not JSON; an empty list dropped),
//     tool_call_id (a tool message's), name (when a string), tools (a
//     developer message's, null when absent)}; content is the text parts
//     joined by newlines, or with the "openai" format a list of {"type":
//     "text", "text": ...} parts (a tool message's still joined);
//   - for a template without the developer role, developer messages
//     become system ones, and several system messages, or one not first,
//     are merged into one, first, their texts joined by blank lines;
//   - each tool as {type, function: {name, description, parameters,
//     strict when set}}.
//
// What vLLM renders differently from release to release, or from data
// llmlb does not see, or what the template engine would print unlike
// Jinja2 (printable; a tool without a description), is refused with
// ErrNotRendered: reasoning fields (read as "reasoning" or as
// "reasoning_content" depending on the release), content parts other
// than text, tools other than functions, deferred tools, a model-specific
// task.
func vllmConversation(messages, tools json.RawMessage, tmpl templateTraits) (conv, toolDicts []byte, err error) {
	var msgs []convMessage
	ok := jsontop.Elements(messages, func(raw []byte) bool {
		var w wireMessage
		if !jsontop.Members(raw, w.set) {
			err = errors.New("not an object")
		} else {
			var m convMessage
			if m, err = readMessage(&w); err == nil {
				msgs = append(msgs, m)
			}
		}
		if err != nil {
			err = fmt.Errorf("%w: messages[%d]: %v", ErrNotRendered, len(msgs), err)
			return false
		}
		return true
	})
	if !ok {
		return nil, nil, cmp.Or(err, fmt.Errorf("%w: messages is not an array", ErrNotRendered))
	}
	if !tmpl.developer {
		if msgs, err = developerAsSystem(msgs); err != nil {
			return nil, nil, fmt.Errorf("%w: %v", ErrNotRendered, err)
		}
	}
	var b bytes.Buffer
	b.Grow(len(messages) + 256)
	b.WriteByte('[')
	for i := range msgs {
		if i > 0 {
			b.WriteString(", ")
		}
		if err := msgs[i].write(&b, tmpl.openai); err != nil {
			return nil, nil, fmt.Errorf("%w: messages[%d]: %v", ErrNotRendered, i, err)
		}
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

// templateTraits is what vllmConversation needs of the template.
type templateTraits struct {
	openai    bool // content as a list of text parts (ContentFormat "openai")
	developer bool // the template knows the developer role
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

// convMessage is one message of the conversation vLLM builds.
type convMessage struct {
	role string
	// text is the content as the JSON string it came as (most messages:
	// written as it is), or nil with texts its text parts.
	text  json.RawMessage
	texts []string
	w     *wireMessage
	// merged marks the system message developerAsSystem merges, whose
	// content vLLM builds after parsing: a string in either format.
	merged bool
}

func readMessage(w *wireMessage) (convMessage, error) {
	m := convMessage{w: w}
	if err := json.Unmarshal(w.Role, &m.role); err != nil || m.role == "" {
		return m, errors.New("no role")
	}
	for _, f := range []json.RawMessage{w.Reasoning, w.ReasoningContent, w.Task} {
		if !isNull(f) {
			return m, errors.New("reasoning or a task")
		}
	}
	if len(w.Content) > 0 && w.Content[0] == '"' {
		m.text = w.Content
		return m, nil
	}
	var err error
	m.texts, err = contentTexts(w.Content)
	return m, err
}

// joined is the message's text parts joined by newlines.
func (m *convMessage) joined() (string, error) {
	if m.text != nil {
		var s string
		err := json.Unmarshal(m.text, &s)
		return s, err
	}
	return strings.Join(m.texts, "\n"), nil
}

// developerAsSystem makes developer messages system ones and merges the
// system messages into one, first, when there are several or one is not
// first (vLLM's _convert_developer_to_system and
// _consolidate_system_messages, for a template without the developer
// role).
func developerAsSystem(msgs []convMessage) ([]convMessage, error) {
	developer := false
	for i := range msgs {
		if msgs[i].role == "developer" {
			developer = true
			msgs[i].role = "system"
			w := *msgs[i].w
			w.Role, w.Tools = json.RawMessage(`"system"`), nil
			msgs[i].w = &w
		}
	}
	if !developer {
		return msgs, nil
	}
	var systems []string
	merge := false
	rest := make([]convMessage, 0, len(msgs))
	for i := range msgs {
		if msgs[i].role != "system" {
			rest = append(rest, msgs[i])
			continue
		}
		merge = merge || i > 0 || len(systems) > 0
		text, err := msgs[i].joined()
		if err != nil {
			return nil, err
		}
		if text != "" {
			systems = append(systems, text)
		}
	}
	if !merge {
		return msgs, nil
	}
	q, _ := json.Marshal(strings.Join(systems, "\n\n"))
	merged := convMessage{role: "system", text: q, w: &wireMessage{Role: json.RawMessage(`"system"`)}, merged: true}
	return append([]convMessage{merged}, rest...), nil
}

func (m *convMessage) write(b *bytes.Buffer, openai bool) error {
	w := m.w
	b.WriteString(`{"role": `)
	b.Write(w.Role)
	b.WriteString(`, "content": `)
	switch {
	case openai && m.role != "tool" && !m.merged:
		b.WriteByte('[')
		if m.text != nil {
			b.WriteString(`{"type": "text", "text": `)
			b.Write(m.text)
			b.WriteByte('}')
		}
		for i, t := range m.texts {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(`{"type": "text", "text": `)
			writeString(b, t)
			b.WriteByte('}')
		}
		b.WriteByte(']')
	case m.text != nil:
		b.Write(m.text) // a string, as it came
	default:
		writeString(b, strings.Join(m.texts, "\n"))
	}
	switch m.role {
	case "assistant":
		if !isNull(w.ToolCalls) {
			if err := writeToolCalls(b, w.ToolCalls); err != nil {
				return err
			}
		}
	case "tool":
		if w.ToolCallID != nil { // present, even as null
			b.WriteString(`, "tool_call_id": `)
			b.Write(w.ToolCallID)
		}
	}
	if len(w.Name) > 0 && w.Name[0] == '"' {
		b.WriteString(`, "name": `)
		b.Write(w.Name)
	}
	if m.role == "developer" {
		b.WriteString(`, "tools": `)
		if w.Tools == nil {
			b.WriteString("null")
		} else {
			b.Write(w.Tools)
		}
	}
	b.WriteByte('}')
	return nil
}

// contentTexts is a message's text parts: none for null, the text of
// each text part with text (vLLM skips one without).
func contentTexts(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var parts []struct {
		Type string           `json:"type"`
		Text *json.RawMessage `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return nil, errors.New("content is neither a string nor an array of parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type != "text" {
			return nil, fmt.Errorf("a %q content part", p.Type)
		}
		if p.Text == nil || isNull(*p.Text) {
			continue // vLLM skips a text part without text
		}
		var s string
		if err := json.Unmarshal(*p.Text, &s); err != nil {
			return nil, errors.New("a text part's text is not a string")
		}
		texts = append(texts, s)
	}
	return texts, nil
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
