package simreplica

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// The OpenAI wire shapes the simulator reads and writes, as vLLM's
// entrypoints/openai/protocol.py spells them (only the fields that matter here).

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	Model               string         `json:"model"`
	Messages            []chatMessage  `json:"messages"`
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Stream              bool           `json:"stream"`
	StreamOptions       *streamOptions `json:"stream_options"`
	N                   *int           `json:"n"`
	Tools               []struct {
		Function struct {
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
		} `json:"function"`
	} `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"` // "auto" | "required" | "none" | {"type":"function","function":{"name":...}}
	Priority   int             `json:"priority"`    // vLLM's: lower first, with --scheduling-policy priority
}

// toolCall is a chat completion's call of a function, whole or as a
// stream delta.
type toolCall struct {
	Index    *int         `json:"index,omitempty"`
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"`
	Function toolFunction `json:"function"`
}

type toolFunction struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// chatMessage is one message; content is a string or an array of parts.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	Model         string          `json:"model"`
	Prompt        json.RawMessage `json:"prompt"`
	MaxTokens     *int            `json:"max_tokens"`
	Stream        bool            `json:"stream"`
	StreamOptions *streamOptions  `json:"stream_options"`
	N             *int            `json:"n"`
	Priority      int             `json:"priority"` // as chatRequest's
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// messageText returns a message's text: a string, or the text parts of a
// content array joined by newlines, as vLLM joins them for chat templates
// that take a string (other parts, such as images, count as nothing).
func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of content parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

// chatMessages reads a chat request's messages: each needs a role, its
// content is its text (messageText).
func chatMessages(msgs []chatMessage) ([]tokenize.Message, error) {
	if len(msgs) == 0 {
		return nil, errors.New("messages must be a non-empty array")
	}
	tm := make([]tokenize.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role is required", i)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d].content: %w", i, err)
		}
		tm[i] = tokenize.Message{Role: m.Role, Content: text}
	}
	return tm, nil
}

// chatPrompt renders the messages with the pseudo-tokenizer's chat template.
func chatPrompt(msgs []chatMessage) (tokenize.Prompt, error) {
	tm, err := chatMessages(msgs)
	if err != nil {
		return tokenize.Prompt{}, err
	}
	return tokenize.FromText(tokenize.RenderChat(tm)), nil
}

// completionPrompt reads a completions prompt: a string, an array of one
// string, or an array of token ids (each BlockSize ids make one block key).
func completionPrompt(raw json.RawMessage) (tokenize.Prompt, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return tokenize.Prompt{}, errors.New("prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return tokenize.FromText(s), nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil {
		if len(ss) != 1 {
			return tokenize.Prompt{}, errors.New("the simulator accepts exactly one prompt per request")
		}
		return tokenize.FromText(ss[0]), nil
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return tokenize.Prompt{}, errors.New("prompt must not be empty")
		}
		return tokenPrompt(ids), nil
	}
	return tokenize.Prompt{}, errors.New("prompt must be a string, an array of one string, or an array of token ids")
}

// tokenPrompt turns token ids into a prompt: equal id prefixes give equal blocks.
func tokenPrompt(ids []int64) tokenize.Prompt {
	keys := make([]uint64, 0, len(ids)/tokenize.BlockSize)
	var buf [8]byte
	for b := 0; b+tokenize.BlockSize <= len(ids); b += tokenize.BlockSize {
		h := fnv.New64a()
		for _, id := range ids[b : b+tokenize.BlockSize] {
			for i := range buf {
				buf[i] = byte(uint64(id) >> (8 * i))
			}
			h.Write(buf[:])
		}
		keys = append(keys, h.Sum64())
	}
	return tokenize.FromBlockKeys(len(ids), keys)
}

// delta is a streamed chat message fragment.
type delta struct {
	Role      string     `json:"role,omitempty"`
	Content   *string    `json:"content,omitempty"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

// chunkChoice covers both chat (Delta) and completion (Text) stream choices.
type chunkChoice struct {
	Index        int     `json:"index"`
	Delta        *delta  `json:"delta,omitempty"`
	Text         *string `json:"text,omitempty"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
	StopReason   any     `json:"stop_reason,omitempty"`
}

// chunk is one SSE data object: "chat.completion.chunk" or "text_completion".
type chunk struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *openai.Usage `json:"usage,omitempty"`
}

type message struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	ToolCalls []toolCall `json:"tool_calls"`
}

// choice is a non-streamed choice: Message for chat, Text for completions.
type choice struct {
	Index        int      `json:"index"`
	Message      *message `json:"message,omitempty"`
	Text         *string  `json:"text,omitempty"`
	Logprobs     any      `json:"logprobs"`
	FinishReason string   `json:"finish_reason"`
	StopReason   any      `json:"stop_reason"`
}

// completion is a full "chat.completion" or "text_completion" response.
type completion struct {
	ID      string        `json:"id"`
	Object  string        `json:"object"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []choice      `json:"choices"`
	Usage   *openai.Usage `json:"usage"`
}

// modelList is the /v1/models response.
type modelList = openai.List[modelCard]

// modelCard is a model as vLLM lists it: OpenAI's fields and vLLM's own.
type modelCard struct {
	openai.Model
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

// fillerWords are the simulated model's vocabulary: token i is word i mod len.
var fillerWords = [...]string{
	"The", " quick", " brown", " fox", " jumps", " over", " the", " lazy",
	" dog", ".", " A", " simulated", " replica", " says", " hello", ",",
}

// tokenText is the deterministic text of output token i (0-based).
func tokenText(i int) string { return fillerWords[i%len(fillerWords)] }

// outputText is the text of the first n output tokens.
func outputText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(tokenText(i))
	}
	return b.String()
}
