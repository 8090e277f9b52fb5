package openai

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/jsontop"
)

// chunk holds the fields of a stream chunk that are read.
type chunk struct {
	Model   string        `json:"model"`
	Choices []chunkChoice `json:"choices"`
	Usage   *readUsage    `json:"usage"`
}

// chunkChoice is what is read of a stream chunk's choice.
type chunkChoice struct {
	Text  string     `json:"text"`
	Delta chunkDelta `json:"delta"`
}

// chunkDelta is what is read of a choice's delta.
type chunkDelta struct {
	Content          string          `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Reasoning        string          `json:"reasoning"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

// completion is what is read of a non-streamed answer: its choices, most
// of its bytes, are skipped rather than decoded.
type completion struct {
	Model string     `json:"model"`
	Usage *readUsage `json:"usage"`
}

// The JSON names of chunk's and completion's fields, in their order, for
// decodeTop.
var (
	chunkFields      = []string{"model", "choices", "usage"}
	completionFields = []string{"model", "usage"}
)

// decodeChunk decodes a stream chunk's data into c.
func decodeChunk(data []byte, c *chunk) bool {
	return decodeTop(data, chunkFields, &c.Model, &c.Choices, &c.Usage)
}

// decodeCompletion decodes a non-streamed answer into c.
func decodeCompletion(body []byte, c *completion) bool {
	return decodeTop(body, completionFields, &c.Model, &c.Usage)
}

// hasToken reports whether c carries a generated token: text, content,
// reasoning or a tool call (a role-only first chunk does not).
func (c *chunk) hasToken() bool {
	for _, ch := range c.Choices {
		d := ch.Delta
		if ch.Text != "" || d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" ||
			(len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" && string(d.ToolCalls) != "[]") {
			return true
		}
	}
	return false
}

// decodeTop decodes the members of the JSON object body that encoding/json
// would match to names (exactly or case-insensitively) into the targets of
// the same index, in the body's order, and skips the other members without
// decoding them: json.Unmarshal of a whole answer, nearly all of it
// choices, was 5% of the proxy's CPU. On a valid JSON body it gives what
// json.Unmarshal into a struct of those fields gives, a failure (a value
// of the wrong type) included (FuzzDecodeTop checks it). An invalid body
// fails too, unless it breaks only inside a member that is skipped.
func decodeTop(body []byte, names []string, targets ...any) bool {
	if string(bytes.Trim(body, " \t\r\n")) == "null" {
		return true // json.Unmarshal leaves the struct as it is
	}
	return jsontop.Members(body, func(key, value []byte) bool {
		for k, name := range names {
			if bytes.EqualFold(key, []byte(name)) {
				return decodeValue(value, targets[k])
			}
		}
		return true
	})
}

// decodeValue is json.Unmarshal(value, into) == nil, without its
// reflection for the usual shapes of what is read: a string without
// escapes, and a usage object of plain integers. Anything else goes to
// json.Unmarshal.
func decodeValue(value []byte, into any) bool {
	switch v := into.(type) {
	case *string:
		if s, ok := plainString(value); ok {
			*v = s
			return true
		}
	case **readUsage:
		if u, ok := plainUsage(value, *v); ok {
			*v = u
			return true
		}
	case *[]chunkChoice:
		if *v == nil {
			if cs, ok := plainChoices(value); ok {
				*v = cs
				return true
			}
		}
	}
	return json.Unmarshal(value, into) == nil
}

// plainChoices decodes a stream chunk's choices as json.Unmarshal into a
// nil slice would, when they have the usual shape: an array of objects
// whose text and delta's strings are strings (or null) and whose delta is
// an object (or null); ok is false otherwise. Every chunk of a stream
// passes here: json.Unmarshal of its choices was the deepest moment of a
// proxied stream's stack (encoding/json's recursion under ReverseProxy's
// copy loop), which a held stream keeps, and a reflection per chunk.
func plainChoices(raw []byte) ([]chunkChoice, bool) {
	var cs []chunkChoice
	ok := jsontop.Elements(raw, func(elem []byte) bool {
		var c chunkChoice
		if i := jsontop.SkipSpace(elem, 0); i >= len(elem) || elem[i] != '{' {
			return false // null or not an object: json.Unmarshal decides
		}
		if !jsontop.Members(elem, func(key, value []byte) bool {
			switch {
			case bytes.EqualFold(key, []byte("text")):
				return stringOrNull(value, &c.Text)
			case bytes.EqualFold(key, []byte("delta")):
				return plainDelta(value, &c.Delta)
			}
			return true
		}) {
			return false
		}
		cs = append(cs, c)
		return true
	})
	if !ok {
		return nil, false
	}
	if cs == nil {
		cs = []chunkChoice{} // json.Unmarshal makes an empty array an empty slice
	}
	return cs, true
}

// plainDelta decodes a choice's delta into d as json.Unmarshal would (into
// the same struct: a repeated delta merges), for plainChoices.
func plainDelta(raw []byte, d *chunkDelta) bool {
	if string(raw) == "null" {
		return true
	}
	return jsontop.Members(raw, func(key, value []byte) bool {
		switch {
		case bytes.EqualFold(key, []byte("content")):
			return stringOrNull(value, &d.Content)
		case bytes.EqualFold(key, []byte("reasoning_content")):
			return stringOrNull(value, &d.ReasoningContent)
		case bytes.EqualFold(key, []byte("reasoning")):
			return stringOrNull(value, &d.Reasoning)
		case bytes.EqualFold(key, []byte("tool_calls")):
			d.ToolCalls = append(d.ToolCalls[:0], value...) // json.RawMessage's own UnmarshalJSON
		}
		return true
	})
}

// stringOrNull decodes a JSON string (null leaves s as it is) into s; a
// string with escapes goes to json.Unmarshal, which is shallow for a
// string; false for anything else.
func stringOrNull(raw []byte, s *string) bool {
	if v, ok := plainString(raw); ok {
		*s = v
		return true
	}
	if string(raw) == "null" {
		return true
	}
	if len(raw) == 0 || raw[0] != '"' {
		return false
	}
	return json.Unmarshal(raw, s) == nil
}

// plainString returns the value of a JSON string literal without escapes
// or control characters, in valid UTF-8; ok is false for anything else.
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	for _, c := range in {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// plainUsage decodes a usage object over prev as json.Unmarshal would
// (null clears it, members update a copy of it), when every member it
// reads is a plain integer (or prompt_tokens_details null or an object of
// them); ok is false otherwise, and prev is left untouched.
func plainUsage(raw []byte, prev *readUsage) (*readUsage, bool) {
	if string(raw) == "null" {
		return nil, true
	}
	var u readUsage
	if prev != nil {
		u = *prev
	}
	ok := jsontop.Members(raw, func(key, value []byte) bool {
		switch {
		case bytes.EqualFold(key, []byte("prompt_tokens")):
			return plainInt(value, &u.PromptTokens)
		case bytes.EqualFold(key, []byte("completion_tokens")):
			return plainInt(value, &u.CompletionTokens)
		case bytes.EqualFold(key, []byte("input_tokens")):
			return plainInt(value, &u.InputTokens)
		case bytes.EqualFold(key, []byte("output_tokens")):
			return plainInt(value, &u.OutputTokens)
		case bytes.EqualFold(key, []byte("cache_read_input_tokens")):
			return plainInt(value, &u.CacheReadInputTokens)
		case bytes.EqualFold(key, []byte("cache_creation_input_tokens")):
			return plainInt(value, &u.CacheCreationInputTokens)
		case bytes.EqualFold(key, []byte("prompt_tokens_details")):
			if string(value) == "null" {
				u.PromptTokensDetails = nil
				return true
			}
			var d readDetails
			if u.PromptTokensDetails != nil {
				d = *u.PromptTokensDetails
			}
			u.PromptTokensDetails = &d
			return jsontop.Members(value, func(key, value []byte) bool {
				if bytes.EqualFold(key, []byte("cached_tokens")) {
					return plainInt(value, &d.CachedTokens)
				}
				return true
			})
		}
		return true
	})
	if !ok {
		return nil, false
	}
	return &u, true
}

// plainInt parses a JSON integer of at most 17 digits into n; ok is false
// for anything else (a fraction, an exponent, null, a string).
func plainInt(raw []byte, n *int64) bool {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 17 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	var v int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		v = v*10 + int64(c-'0')
	}
	if len(digits) < len(raw) {
		v = -v
	}
	*n = v
	return true
}
