package request

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// parseChat reads a chat body: the system text (system and developer
// messages, else a top-level system prompt), the rendered prompt and its
// estimated tokens (tool definitions included).
func parseChat(b *requestBody) (system, prompt string, tokens int, err error) {
	msgs, system, err := parseMessages(b)
	if err != nil {
		return "", "", 0, err
	}
	if system == "" {
		if system, err = topLevelSystem(b.fields); err != nil {
			return "", "", 0, err
		}
		if system != "" {
			// The Messages API's system prompt heads the prompt the
			// replica computes (and that sessions sharing it share).
			msgs = append([]tokenize.Message{{Role: "system", Content: system}}, msgs...)
		}
	}
	if msgs != nil {
		prompt = tokenize.RenderChat(msgs)
	}
	return system, prompt, tokenize.CountText(prompt) + rawTokens(b.fields["tools"]), nil
}

// parseMessages returns the messages for rendering, plus the system and
// developer messages' text joined by newlines. A body without messages
// gives nil messages and no error.
func parseMessages(b *requestBody) ([]tokenize.Message, string, error) {
	if !b.hasMessages {
		return nil, "", nil
	}
	if err := b.messagesErr; err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field == "" && typeErr.Type.Kind() == reflect.Slice {
			return nil, "", badf(err, `"messages" must be an array`)
		}
		return nil, "", badf(err, `invalid "messages": %s`, jsonErrorText(err))
	}
	out := make([]tokenize.Message, 0, len(b.messages))
	// The system texts joined by newlines; the usual single one is used as
	// it is, the builder copies only when a second one joins it.
	var system string
	var joined strings.Builder
	for i := range b.messages {
		m := &b.messages[i]
		text, err := m.text, error(nil)
		if !m.isText {
			text, err = contentText(m.Content)
		}
		if err != nil {
			return nil, "", badf(err, `"messages[%d].content" must be a string or an array of content parts`, i)
		}
		if (m.Role == "system" || m.Role == "developer") && text != "" {
			if system == "" {
				system = text
			} else {
				if joined.Len() == 0 {
					joined.WriteString(system)
				}
				joined.WriteByte('\n')
				joined.WriteString(text)
			}
		}
		if !isNull(m.ToolCalls) {
			text += compactJSON(m.ToolCalls)
		}
		out = append(out, tokenize.Message{Role: m.Role, Content: text})
	}
	if joined.Len() > 0 {
		system = joined.String()
	}
	return out, system, nil
}

// contentText returns a message content's text: a string, or the text
// parts of an array of content parts joined by newlines (images and other
// parts carry no text and are skipped).
func contentText(content any) (string, error) {
	switch c := content.(type) {
	case nil:
		return "", nil
	case string:
		return c, nil
	case []any:
		var b strings.Builder
		for _, part := range c {
			text, err := partText(part)
			if err != nil {
				return "", err
			}
			if text == "" {
				continue
			}
			if b.Len() > 0 {
				b.WriteByte('\n')
			}
			b.WriteString(text)
		}
		return b.String(), nil
	}
	return "", errors.New("content is neither a string nor an array")
}

func partText(part any) (string, error) {
	switch p := part.(type) {
	case nil:
		return "", nil
	case string:
		return p, nil
	case map[string]any:
		switch typ, _ := p["type"].(string); typ {
		case "text", "input_text", "output_text":
		case "tool_use":
			return toolUseText(p), nil
		case "tool_result":
			return toolResultText(p), nil
		default:
			return "", nil // images, documents: no text
		}
		switch text := p["text"].(type) {
		case string:
			return text, nil
		case nil:
			return "", nil
		}
		return "", errors.New(`a text part's "text" is not a string`)
	}
	return "", errors.New("content part is neither an object nor a string")
}

// rawTokens estimates the tokens of a raw JSON value (tool definitions).
func rawTokens(raw json.RawMessage) int {
	if isNull(raw) {
		return 0
	}
	return tokenize.CountText(compactJSON(raw))
}
