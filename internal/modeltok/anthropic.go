package modeltok

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/llmlb/llmlb/internal/jsontop"
	"github.com/llmlb/llmlb/internal/request"
)

// anthropicChat turns an Anthropic Messages API request into the chat
// request vLLM serves it as (vllm/entrypoints/anthropic/serving.py), for
// the parts that shape the prompt:
//   - one system message first: the system field's text, and that of
//     system messages, joined without separator; Claude Code's billing
//     header block left out;
//   - each message's text blocks as its content (one as a string, more
//     as text parts); tool_use blocks as tool calls whose arguments are
//     their input; a user message's tool_result blocks as tool messages
//     placed before it (their text blocks joined by newlines), the user
//     message dropped when nothing else is left of it; an assistant's
//     tool_result as the text "Tool result: " and its string content;
//   - each tool as a function of its input_schema;
//   - output_config.effort as the reasoning effort.
//
// What vLLM would answer with an error or render from data llmlb does not
// reproduce is refused with ErrNotRendered: images and documents,
// thinking blocks, a tool_use without an id (vLLM makes one from the
// clock), tool references, a non-string tool result of an assistant.
func anthropicChat(req request.ChatRequest) (request.ChatRequest, error) {
	var msgs []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(req.Messages, &msgs); err != nil {
		return req, fmt.Errorf("%w: messages: %v", ErrNotRendered, err)
	}
	var system []string
	if err := systemTexts(req.System, &system); err != nil {
		return req, err
	}
	for _, m := range msgs {
		if m.Role == "system" {
			if err := systemTexts(m.Content, &system); err != nil {
				return req, err
			}
		}
	}
	var b bytes.Buffer
	b.WriteByte('[')
	n := 0
	sep := func() {
		if n > 0 {
			b.WriteString(", ")
		}
		n++
	}
	if len(system) > 0 {
		sep()
		b.WriteString(`{"role": "system", "content": `)
		writeString(&b, strings.Join(system, ""))
		b.WriteByte('}')
	}
	for i, m := range msgs {
		if m.Role == "system" {
			continue
		}
		if err := writeAnthropicMessage(&b, m.Role, m.Content, sep); err != nil {
			return req, fmt.Errorf("%w: messages[%d]: %v", ErrNotRendered, i, err)
		}
	}
	b.WriteByte(']')
	out := request.ChatRequest{Messages: b.Bytes(), TemplateKwargs: req.TemplateKwargs}
	if !isNull(req.Tools) {
		tools, err := anthropicTools(req.Tools)
		if err != nil {
			return req, err
		}
		out.Tools = tools
	}
	if !isNull(req.OutputConfig) {
		var oc struct {
			Effort json.RawMessage `json:"effort"`
		}
		if err := json.Unmarshal(req.OutputConfig, &oc); err != nil {
			return req, fmt.Errorf("%w: output_config: %v", ErrNotRendered, err)
		}
		if !isNull(oc.Effort) {
			out.ReasoningEffort = oc.Effort
		}
	}
	return out, nil
}

// anthropicBlock is the part of a content block the conversion reads.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text"`
	ID        *string         `json:"id"`
	Name      *string         `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID *string         `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
}

// systemTexts appends the non-empty texts of a system field or message:
// a string, or its text blocks but the billing header's.
func systemTexts(raw json.RawMessage, out *[]string) error {
	if isNull(raw) {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return fmt.Errorf("%w: system: %v", ErrNotRendered, err)
		}
		if s != "" {
			*out = append(*out, s)
		}
		return nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return fmt.Errorf("%w: system: %v", ErrNotRendered, err)
	}
	for _, bl := range blocks {
		if bl.Type == "text" && bl.Text != nil && *bl.Text != "" && !strings.HasPrefix(*bl.Text, "x-anthropic-billing-header") {
			*out = append(*out, *bl.Text)
		}
	}
	return nil
}

func writeAnthropicMessage(b *bytes.Buffer, role string, content json.RawMessage, sep func()) error {
	roleJSON, _ := json.Marshal(role)
	if len(content) > 0 && content[0] == '"' {
		sep()
		b.WriteString(`{"role": `)
		b.Write(roleJSON)
		b.WriteString(`, "content": `)
		b.Write(content)
		b.WriteByte('}')
		return nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(content, &blocks); err != nil {
		return errors.New("content is neither a string nor blocks")
	}
	var texts []string
	var calls bytes.Buffer
	for _, bl := range blocks {
		switch bl.Type {
		case "text":
			if bl.Text != nil && *bl.Text != "" {
				texts = append(texts, *bl.Text)
			}
		case "tool_use":
			if bl.ID == nil || *bl.ID == "" {
				return errors.New("a tool_use without an id")
			}
			if calls.Len() > 0 {
				calls.WriteString(", ")
			}
			id, _ := json.Marshal(*bl.ID)
			name := ""
			if bl.Name != nil {
				name = *bl.Name
			}
			nameJSON, _ := json.Marshal(name)
			args := bl.Input
			if isNull(args) || args[0] != '{' {
				args = json.RawMessage("{}")
			}
			calls.WriteString(`{"id": `)
			calls.Write(id)
			calls.WriteString(`, "type": "function", "function": {"name": `)
			calls.Write(nameJSON)
			calls.WriteString(`, "arguments": `)
			calls.Write(args)
			calls.WriteString(`}}`)
		case "tool_result":
			if role != "user" {
				text := ""
				if !isNull(bl.Content) {
					if bl.Content[0] != '"' {
						return errors.New("an assistant's tool_result that is not a string")
					}
					_ = json.Unmarshal(bl.Content, &text)
				}
				texts = append(texts, "Tool result: "+text)
				continue
			}
			text, err := toolResultText(bl.Content)
			if err != nil {
				return err
			}
			id := ""
			if bl.ToolUseID != nil {
				id = *bl.ToolUseID
			}
			idJSON, _ := json.Marshal(id)
			sep()
			b.WriteString(`{"role": "tool", "tool_call_id": `)
			b.Write(idJSON)
			b.WriteString(`, "content": `)
			writeString(b, text)
			b.WriteByte('}')
		case "redacted_thinking":
		default:
			return fmt.Errorf("a %q block", bl.Type)
		}
	}
	if role == "user" && len(texts) == 0 && calls.Len() == 0 {
		return nil // only tool results: vLLM drops the message
	}
	sep()
	b.WriteString(`{"role": `)
	b.Write(roleJSON)
	switch len(texts) {
	case 0:
	case 1:
		b.WriteString(`, "content": `)
		writeString(b, texts[0])
	default:
		b.WriteString(`, "content": [`)
		for i, t := range texts {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(`{"type": "text", "text": `)
			writeString(b, t)
			b.WriteByte('}')
		}
		b.WriteByte(']')
	}
	if calls.Len() > 0 {
		b.WriteString(`, "tool_calls": [`)
		b.Write(calls.Bytes())
		b.WriteByte(']')
	}
	b.WriteByte('}')
	return nil
}

// toolResultText is a user's tool_result content as vLLM reads it: a
// string, or its text items joined by newlines.
func toolResultText(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		err := json.Unmarshal(raw, &s)
		return s, err
	}
	var texts []string
	ok := jsontop.Elements(raw, func(v []byte) bool {
		var item struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if len(v) == 0 || v[0] != '{' {
			return true // vLLM skips what is not an object
		}
		if json.Unmarshal(v, &item) != nil {
			return false
		}
		switch item.Type {
		case "text":
			t := ""
			if item.Text != nil {
				t = *item.Text
			}
			texts = append(texts, t)
			return true
		}
		return false // images, tool references
	})
	if !ok {
		return "", errors.New("a tool_result with content other than text")
	}
	return strings.Join(texts, "\n"), nil
}

// anthropicTools turns Anthropic tools into chat tools: functions of
// their input_schema.
func anthropicTools(raw json.RawMessage) (json.RawMessage, error) {
	var tools []struct {
		Name         json.RawMessage `json:"name"`
		Description  json.RawMessage `json:"description"`
		InputSchema  json.RawMessage `json:"input_schema"`
		DeferLoading json.RawMessage `json:"defer_loading"`
		Type         *string         `json:"type"`
	}
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, fmt.Errorf("%w: tools: %v", ErrNotRendered, err)
	}
	var b bytes.Buffer
	b.WriteByte('[')
	for i, t := range tools {
		if t.Type != nil && *t.Type != "custom" && *t.Type != "function" {
			return nil, fmt.Errorf("%w: tools[%d]: a %q tool", ErrNotRendered, i, *t.Type)
		}
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`{"type": "function", "function": {"name": `)
		b.Write(orNull(t.Name))
		b.WriteString(`, "description": `)
		b.Write(orNull(t.Description))
		b.WriteString(`, "parameters": `)
		b.Write(orNull(t.InputSchema))
		if !isNull(t.DeferLoading) {
			b.WriteString(`, "defer_loading": `)
			b.Write(t.DeferLoading)
		}
		b.WriteString(`}}`)
	}
	b.WriteByte(']')
	return b.Bytes(), nil
}
