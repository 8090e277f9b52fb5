package request

import (
	"encoding/json"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// chatRenderFields are chat request fields that change how vLLM renders
// the prompt in ways llmlb does not reproduce (tool definitions,
// documents, a template of the request's own or its arguments): a request
// with any of them is hashed from its text, not its model's tokens.
var chatRenderFields = []string{"tools", "documents", "chat_template", "chat_template_kwargs"}

// maxTokenizedMessages bounds the messages of a chat whose prompt is
// rendered with the model's template: rendering costs per message, and a
// body of a million empty messages is small.
const maxTokenizedMessages = 4096

// modelTokens tokenizes a chat or completion prompt with the model's own
// tokenizer (Config.Tokenizer), as the engine tokenizes it. ok is false
// when the model has none, or when llmlb cannot render the prompt as the
// engine does: tool calls, content parts other than text, the fields of
// chatRenderFields, a generation prompt turned off, a prompt larger than
// MaxPromptBlockBytes or of more than maxTokenizedMessages messages, a
// batch of prompts, a template that refuses the
// conversation. The caller then hashes the prompt's text.
func modelTokens(cfg Config, ep endpoint, b *requestBody, model string) (ids []uint32, ok bool) {
	if cfg.Tokenizer == nil {
		return nil, false
	}
	switch ep {
	case endpointChat:
		if !plainChat(b) {
			return nil, false
		}
		tk := cfg.Tokenizer(model)
		if tk == nil {
			return nil, false
		}
		msgs, _, err := parseMessages(b)
		if err != nil || len(msgs) == 0 {
			return nil, false
		}
		ids, err = tk.ChatTokens(msgs)
		return ids, err == nil
	case endpointCompletions:
		raw := b.fields["prompt"]
		if len(raw) == 0 || len(raw) > MaxPromptBlockBytes {
			return nil, false
		}
		tk := cfg.Tokenizer(model)
		if tk == nil {
			return nil, false
		}
		switch raw[0] {
		case '"':
			var s string
			if json.Unmarshal(raw, &s) != nil {
				return nil, false
			}
			ids, err := tk.PromptTokens(s)
			return ids, err == nil
		case '[':
			// Token ids are what the engine computes as they are.
			if json.Unmarshal(raw, &ids) == nil {
				return ids, true
			}
		}
	}
	return nil, false
}

// plainChat reports whether a chat body is one whose prompt llmlb renders
// as the engine does: messages of text only, no tool calls, none of
// chatRenderFields, the generation prompt on, nothing to continue, at
// most maxTokenizedMessages messages and MaxPromptBlockBytes of text.
func plainChat(b *requestBody) bool {
	if !b.hasMessages || b.messagesErr != nil || len(b.messages) > maxTokenizedMessages {
		return false
	}
	for _, name := range chatRenderFields {
		if !isNull(b.fields[name]) {
			return false
		}
	}
	if raw := b.fields["add_generation_prompt"]; !isNull(raw) && string(raw) != "true" {
		return false
	}
	if raw := b.fields["continue_final_message"]; !isNull(raw) && string(raw) != "false" {
		return false
	}
	size := 0
	for i := range b.messages {
		m := &b.messages[i]
		if !isNull(m.ToolCalls) {
			return false
		}
		switch c := m.Content.(type) {
		case nil:
		case string:
			size += len(c)
		case []any:
			for _, part := range c {
				p, ok := part.(map[string]any)
				if !ok || p["type"] != "text" {
					return false
				}
				text, ok := p["text"].(string)
				if !ok {
					return false
				}
				size += len(text)
			}
		default:
			return false
		}
	}
	return size <= MaxPromptBlockBytes
}

// promptBlocks hashes the prompt's blocks into p: over the model's token
// ids where modelTokens gives them (PromptTokens is then their count),
// else over its text.
func promptBlocks(cfg Config, ep endpoint, b *requestBody, prompt string, p *Profile) {
	if ids, ok := modelTokens(cfg, ep, b, p.Model); ok {
		p.PromptBlocks, p.PromptTokens, p.TokenBlocks = tokenize.FromTokenIDs(ids).Blocks, len(ids), true
		return
	}
	p.PromptBlocks = tokenize.FromText(capText(prompt, MaxPromptBlockBytes)).Blocks
}
