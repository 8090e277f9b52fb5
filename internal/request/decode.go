package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/jsontop"
)

// requestBody is a request body decoded as far as routing needs: every top-level
// field raw, except "messages", which is decoded in the same pass (it holds
// nearly all the bytes, so it is scanned once rather than re-parsed).
type requestBody struct {
	fields      map[string]json.RawMessage
	messages    []message
	rawMessages json.RawMessage // "messages" as sent (a sub-slice of the body)
	hasMessages bool            // "messages" present and not null
	messagesErr error           // a type error inside "messages", reported by parseChat
}

// message is the part of a chat message routing reads.
type message struct {
	Role      string          `json:"role"`
	Content   any             `json:"content"` // string, array of parts or null: decoded in one pass
	ToolCalls json.RawMessage `json:"tool_calls"`
	// text is the content when walkMessages read it as a plain string
	// (isText; Content is then nil): a string put in an interface costs
	// an allocation of its own.
	text   string
	isText bool
}

// content returns the message's content as json.Unmarshal decodes it.
func (m *message) content() any {
	if m.isText {
		return m.text
	}
	return m.Content
}

// decodeObject reads the body's top level. Its values are sub-slices of
// body, not copies, so a 30 MB prompt costs no second 30 MB, and each is
// validated once: "messages" (nearly all the bytes of a chat body) by
// decoding it at once, the others with json.Valid. A type error inside
// "messages" does not stop the other fields from being read. An invalid
// body is decoded again by decodeObjectErr, which says what is wrong (the
// slow path is for bad input only).
func decodeObject(data []byte) (*requestBody, error) {
	d := bytes.TrimLeft(data, " \t\r\n")
	if len(d) == 0 || d[0] != '{' {
		return decodeObjectErr(data)
	}
	b := &requestBody{fields: make(map[string]json.RawMessage, 8)}
	i := jsontop.SkipSpace(d, 1)
	if i < len(d) && d[i] == '}' {
		if jsontop.SkipSpace(d, i+1) != len(d) {
			return decodeObjectErr(data)
		}
		return b, nil
	}
	for {
		if i >= len(d) || d[i] != '"' {
			return decodeObjectErr(data)
		}
		end := jsontop.SkipValue(d, i)
		name, ok := fieldName(d[i:end])
		if !ok {
			if name, ok = unquote(d[i:end]); !ok {
				return decodeObjectErr(data)
			}
		}
		if i = jsontop.SkipSpace(d, end); i >= len(d) || d[i] != ':' {
			return decodeObjectErr(data)
		}
		if i = jsontop.SkipSpace(d, i+1); i >= len(d) {
			return decodeObjectErr(data)
		}
		end = jsontop.SkipValue(d, i)
		raw := json.RawMessage(d[i:end])
		if name == "messages" {
			msgs, err := decodeMessages(raw)
			if err != nil && !isTypeError(err) {
				return decodeObjectErr(data)
			}
			b.messages, b.messagesErr, b.hasMessages = msgs, err, msgs != nil || err != nil
			b.rawMessages = raw
		} else {
			if !json.Valid(raw) {
				return decodeObjectErr(data)
			}
			b.fields[name] = raw
		}
		i = jsontop.SkipSpace(d, end)
		switch {
		case i < len(d) && d[i] == ',':
			i = jsontop.SkipSpace(d, i+1)
		case i < len(d) && d[i] == '}':
			if jsontop.SkipSpace(d, i+1) != len(d) {
				return decodeObjectErr(data)
			}
			return b, nil
		default:
			return decodeObjectErr(data)
		}
	}
}

// isTypeError reports whether err is a *json.UnmarshalTypeError (its own
// function: the target errors.As needs would otherwise be allocated on every
// request, not only on the error path).
func isTypeError(err error) bool {
	var typeErr *json.UnmarshalTypeError
	return errors.As(err, &typeErr)
}

// unquote decodes a JSON string with json.Unmarshal. Its own function:
// the target json.Unmarshal needs would otherwise be allocated for every
// key, also those fieldName reads without it.
func unquote(raw []byte) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// fieldName is plainString for a top-level key: the keys of OpenAI
// requests come back as constants, without allocating a string each.
func fieldName(raw []byte) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		switch string(raw[1 : len(raw)-1]) {
		case "model":
			return "model", true
		case "messages":
			return "messages", true
		case "max_tokens":
			return "max_tokens", true
		case "max_completion_tokens":
			return "max_completion_tokens", true
		case "stream":
			return "stream", true
		case "stream_options":
			return "stream_options", true
		case "prompt":
			return "prompt", true
		case "temperature":
			return "temperature", true
		case "top_p":
			return "top_p", true
		case "tools":
			return "tools", true
		case "user":
			return "user", true
		}
	}
	return plainString(raw)
}

// plainString returns the value of a JSON string literal that needs no
// decoding (no escape, no control character, valid UTF-8) without
// json.Unmarshal's reflection; ok is false for any other input, which the
// caller then decodes with json.Unmarshal (same result, slower).
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	ascii := true
	for _, c := range in {
		switch {
		case c < 0x20 || c == '"' || c == '\\':
			return "", false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if !ascii && !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// decodeMessages decodes a chat "messages" value exactly as json.Unmarshal
// into []message does. The usual shape (an array of objects whose role is a
// plain string, content a string, null or anything else, tool_calls
// anything) is validated once and then walked by hand, without reflection
// and without copying tool_calls; anything else (escaped or case-variant
// keys, a role that is not a plain string, elements that are not objects)
// goes to json.Unmarshal. FuzzDecodeObject holds the two to the same result.
func decodeMessages(raw []byte) ([]message, error) {
	if msgs, ok := walkMessages(raw); ok {
		return msgs, nil
	}
	var msgs []message
	err := json.Unmarshal(raw, &msgs)
	return msgs, err
}

// walkMessages is decodeMessages' fast path; ok is false when it does not
// apply (the caller then decodes with json.Unmarshal).
func walkMessages(raw []byte) (msgs []message, ok bool) {
	if len(raw) == 0 || raw[0] != '[' || !json.Valid(raw) {
		return nil, false
	}
	// Valid JSON from here: skipValue finds every value's end.
	msgs = make([]message, 0, bytes.Count(raw, []byte(`"role"`)))
	i := jsontop.SkipSpace(raw, 1)
	if raw[i] == ']' {
		return msgs, true
	}
	for {
		if raw[i] != '{' {
			return nil, false
		}
		var m message
		i = jsontop.SkipSpace(raw, i+1)
		for raw[i] != '}' {
			end := jsontop.SkipValue(raw, i)
			key := raw[i+1 : end-1]
			i = jsontop.SkipSpace(raw, jsontop.SkipSpace(raw, end)+1) // past ':'
			vend := jsontop.SkipValue(raw, i)
			v := raw[i:vend]
			switch string(key) {
			case "role":
				if string(v) != "null" {
					if m.Role, ok = roleName(v); !ok {
						return nil, false
					}
				}
			case "content":
				if s, ok := plainString(v); ok {
					m.Content, m.text, m.isText = nil, s, true
				} else if m.Content, ok = decodeAny(v, m.content()); !ok {
					return nil, false
				} else {
					m.text, m.isText = "", false
				}
			case "tool_calls":
				m.ToolCalls = json.RawMessage(v)
			default:
				// json.Unmarshal matches field names case-insensitively.
				if !plainKey(key) {
					return nil, false
				}
			}
			if i = jsontop.SkipSpace(raw, vend); raw[i] == ',' {
				i = jsontop.SkipSpace(raw, i+1)
			}
		}
		msgs = append(msgs, m)
		if i = jsontop.SkipSpace(raw, i+1); raw[i] == ']' {
			return msgs, true
		}
		i = jsontop.SkipSpace(raw, i+1) // past ','
	}
}

// decodeAny is json.Unmarshal of raw into an interface holding prev (as
// into a message's Content). Its own function: the message it is read
// into would otherwise be allocated for every message, not only for the
// contents that are not plain strings.
func decodeAny(raw []byte, prev any) (any, bool) {
	v := prev
	if json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	return v, true
}

// roleName is plainString for a message's role: the usual roles come back
// as constants, without allocating a string each.
func roleName(raw []byte) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		switch string(raw[1 : len(raw)-1]) {
		case "system":
			return "system", true
		case "user":
			return "user", true
		case "assistant":
			return "assistant", true
		case "tool":
			return "tool", true
		case "developer":
			return "developer", true
		}
	}
	return plainString(raw)
}

// plainKey reports whether an object key (raw, between its quotes) that is
// none of message's field names also matches none of them
// case-insensitively and needs no unescaping.
func plainKey(key []byte) bool {
	for _, c := range key {
		if c == '\\' || c >= utf8.RuneSelf {
			return false
		}
	}
	for _, name := range []string{"role", "content", "tool_calls"} {
		if strings.EqualFold(string(key), name) {
			return false
		}
	}
	return true
}

// decodeObjectErr decodes the body's top level with a streaming decoder,
// which explains what is wrong with it; decodeObject uses it for invalid
// bodies only (it copies every value: slow for a huge one).
func decodeObjectErr(data []byte) (*requestBody, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 {
		return nil, badf(nil, "empty body: expected a JSON object")
	}
	if trimmed[0] != '{' {
		return nil, badf(nil, "body must be a JSON object")
	}
	b := &requestBody{fields: make(map[string]json.RawMessage)}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	malformed := func(err error) error {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return badf(err, "malformed JSON body: %s", jsonErrorText(err))
	}
	if _, err := dec.Token(); err != nil { // '{'
		return nil, malformed(err)
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, malformed(err)
		}
		name, _ := tok.(string)
		if name == "messages" {
			var msgs []message
			err := dec.Decode(&msgs)
			var typeErr *json.UnmarshalTypeError
			if err != nil && !errors.As(err, &typeErr) {
				return nil, malformed(err)
			}
			b.messages, b.messagesErr, b.hasMessages = msgs, err, msgs != nil || err != nil
			continue
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, malformed(err)
		}
		b.fields[name] = raw
	}
	if _, err := dec.Token(); err != nil { // '}'
		return nil, malformed(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, badf(err, "malformed JSON body: data after the top-level object (at byte %d)", dec.InputOffset())
	}
	return b, nil
}

func jsonErrorText(err error) string {
	var syn *json.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Sprintf("%s (at byte %d)", syn.Error(), syn.Offset)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}
