package request

import (
	"bytes"
	"encoding/json"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// parseResponses reads a Responses API body: "instructions" as the system
// prompt, then "input" (a string, or items: messages with a role and
// content, tool calls and their outputs, anything else as its JSON), and
// "tools" counted as prompt tokens. A shape it does not know is rendered as
// its compact JSON, never an error: the replica validates the request.
func parseResponses(b *requestBody) (system, prompt string, tokens int) {
	system, err := topLevelSystem(b.fields)
	if err != nil {
		system = ""
	}
	var msgs []tokenize.Message
	if system != "" {
		msgs = append(msgs, tokenize.Message{Role: "system", Content: system})
	}
	if raw := bytes.TrimLeft(b.fields["input"], " \t\r\n"); len(raw) > 0 && raw[0] == '[' {
		// Item by item: decoded whole into []any, a 30 MB input of small
		// items would hold half a gigabyte of maps at once.
		dec := json.NewDecoder(bytes.NewReader(raw))
		if _, err := dec.Token(); err == nil {
			for dec.More() {
				var item any
				if dec.Decode(&item) != nil {
					break
				}
				msgs = append(msgs, responseItem(item))
			}
		}
	} else if !isNull(raw) {
		var in string
		if json.Unmarshal(raw, &in) != nil {
			in = compactJSON(raw)
		}
		msgs = append(msgs, tokenize.Message{Role: "user", Content: in})
	}
	if msgs != nil {
		prompt = tokenize.RenderChat(msgs)
	}
	return system, prompt, tokenize.CountText(prompt) + rawTokens(b.fields["tools"])
}

// responseItem renders one item of a Responses API input as a message.
func responseItem(item any) tokenize.Message {
	obj, ok := item.(map[string]any)
	if !ok {
		b, _ := json.Marshal(item)
		return tokenize.Message{Role: "user", Content: string(b)}
	}
	typ, _ := obj["type"].(string)
	role, _ := obj["role"].(string)
	switch {
	case role != "" && (typ == "" || typ == "message"):
		if text, err := contentText(obj["content"]); err == nil {
			return tokenize.Message{Role: role, Content: text}
		}
	case typ == "function_call":
		name, _ := obj["name"].(string)
		args, _ := obj["arguments"].(string)
		return tokenize.Message{Role: "assistant", Content: name + args}
	case typ == "function_call_output":
		if out, ok := obj["output"].(string); ok {
			return tokenize.Message{Role: "tool", Content: out}
		}
		if text, err := contentText(obj["output"]); err == nil {
			return tokenize.Message{Role: "tool", Content: text}
		}
	}
	b, _ := json.Marshal(obj) // reasoning, references, calls of other tools
	if typ == "" {
		typ = "item"
	}
	return tokenize.Message{Role: typ, Content: string(b)}
}
