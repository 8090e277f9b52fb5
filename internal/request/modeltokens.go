package request

import (
	"bytes"
	"encoding/json"

	"github.com/llmlb/llmlb/internal/jsontop"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// chatRenderFields are chat request fields that change how vLLM renders
// the prompt in ways llmlb does not reproduce (documents, a template of
// the request's own): a request with any of them is hashed from its text,
// not its model's tokens.
var chatRenderFields = []string{"documents", "chat_template"}

// toolMarkers are what, found in a chat's messages, sends it to the full
// rendering (PromptTokenizer.ChatRequestTokens) rather than the plain one
// of roles and texts: tool calls and results and the fields that go with
// them, a participant's name, the developer role (which vLLM makes a
// system message for most templates), reasoning (which the full rendering
// refuses).
var toolMarkers = [][]byte{[]byte(`"tool_call`), []byte(`"name"`), []byte(`"reasoning`), []byte(`"tool"`), []byte(`"tools"`), []byte(`"task"`), []byte(`"developer"`)}

// maxTokenizedMessages bounds the messages of a chat whose prompt is
// rendered with the model's template: rendering costs per message, and a
// body of a million empty messages is small.
const maxTokenizedMessages = 4096

// modelTokens tokenizes a chat, Anthropic Messages, Responses API or
// completion prompt with the model's own tokenizer (Config.Tokenizer), as
// the engine tokenizes it. ok is false when the model has none, or when
// llmlb cannot render the prompt as the engine does: what the tokenizer
// refuses to render (tool calls it does not reproduce, content parts other
// than text), the fields of chatRenderFields, a generation prompt turned
// off, a prompt larger than MaxPromptBlockBytes or of more than
// maxTokenizedMessages messages or items, a batch of prompts, a Responses
// request that continues what the server holds (responsesStateFields), a
// template that refuses the conversation. The caller then hashes the
// prompt's text.
func modelTokens(cfg Config, ep endpoint, b *requestBody, model string) (ids []uint32, ok bool) {
	if cfg.Tokenizer == nil {
		return nil, false
	}
	switch ep {
	case endpointChat:
		full := !isNull(b.fields["tools"]) || !isNull(b.fields["chat_template_kwargs"]) ||
			!isNull(b.fields["reasoning_effort"]) || hasToolMarkers(b.rawMessages)
		if !renderableChat(b, &full) {
			return nil, false
		}
		tk := cfg.Tokenizer(model)
		if tk == nil {
			return nil, false
		}
		if full {
			ids, err := tk.ChatRequestTokens(ChatRequest{
				Messages: b.rawMessages, Tools: b.fields["tools"],
				TemplateKwargs: b.fields["chat_template_kwargs"], ReasoningEffort: b.fields["reasoning_effort"],
			})
			return ids, err == nil
		}
		msgs, _, err := parseMessages(b)
		if err != nil || len(msgs) == 0 {
			return nil, false
		}
		ids, err = tk.ChatTokens(msgs)
		return ids, err == nil
	case endpointMessages:
		// An Anthropic Messages request: the tokenizer turns it into the
		// chat vLLM serves it as, and refuses what it cannot render.
		if !b.hasMessages || b.messagesErr != nil || len(b.messages) > maxTokenizedMessages ||
			len(b.rawMessages)+len(b.fields["system"])+len(b.fields["tools"]) > MaxPromptBlockBytes {
			return nil, false
		}
		tk := cfg.Tokenizer(model)
		if tk == nil {
			return nil, false
		}
		ids, err := tk.ChatRequestTokens(ChatRequest{
			Anthropic: true, System: b.fields["system"], OutputConfig: b.fields["output_config"],
			Messages: b.rawMessages, Tools: b.fields["tools"], TemplateKwargs: b.fields["chat_template_kwargs"],
		})
		return ids, err == nil
	case endpointResponses:
		// A Responses API request: the tokenizer turns it into the chat
		// vLLM serves it as, and refuses what it cannot render. One that
		// continues a conversation held by the server (or names a stored
		// prompt) has a prompt llmlb cannot see.
		for _, name := range responsesStateFields {
			if !isNull(b.fields[name]) {
				return nil, false
			}
		}
		input := b.fields["input"]
		if isNull(input) || len(input)+len(b.fields["instructions"])+len(b.fields["tools"]) > MaxPromptBlockBytes ||
			countElements(input) > maxTokenizedMessages {
			return nil, false
		}
		tk := cfg.Tokenizer(model)
		if tk == nil {
			return nil, false
		}
		ids, err := tk.ChatRequestTokens(ChatRequest{
			Responses: true, Input: input, Instructions: b.fields["instructions"], Reasoning: b.fields["reasoning"],
			Tools: b.fields["tools"], TemplateKwargs: b.fields["chat_template_kwargs"],
		})
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

// responsesStateFields are Responses API fields that make the prompt
// depend on what the server holds: earlier turns (previous_response_id,
// conversation), a stored prompt template, or vLLM's previous messages
// (previous_response, previous_input_messages).
var responsesStateFields = []string{"previous_response_id", "conversation", "prompt", "previous_response", "previous_input_messages"}

// countElements is the number of elements of a JSON array (0 for
// anything else), counted without decoding them.
func countElements(raw []byte) int {
	n := 0
	jsontop.Elements(raw, func([]byte) bool {
		n++
		return n <= maxTokenizedMessages
	})
	return n
}

func hasToolMarkers(raw []byte) bool {
	for _, m := range toolMarkers {
		if bytes.Contains(raw, m) {
			return true
		}
	}
	return false
}

// renderableChat reports whether a chat body is one whose prompt llmlb
// renders as the engine does: messages of text only, none of
// chatRenderFields, the generation prompt on, nothing to continue, at
// most maxTokenizedMessages messages and MaxPromptBlockBytes of text. It
// sets *full when a message has tool calls or content parts: those take
// the full rendering, which has the last word on what it renders.
func renderableChat(b *requestBody, full *bool) bool {
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
	size := len(b.fields["tools"])
	for i := range b.messages {
		m := &b.messages[i]
		if !isNull(m.ToolCalls) {
			*full = true
		}
		size += len(m.ToolCalls)
		switch c := m.Content.(type) {
		case nil:
			size += len(m.text) // a plain string, kept apart (message.text)
		case string:
			size += len(c)
		case []any:
			// Parts go to the full rendering, which keeps them apart
			// where the template takes a list and joins them as vLLM
			// does where it takes a string.
			*full = true
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
