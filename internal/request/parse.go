package request

import (
	"bytes"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/textproto"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/jsontop"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// ErrBadRequest wraps every error caused by the client's request (HTTP 400).
var ErrBadRequest = errors.New("bad request")

// Config lists where keys come from (SPEC s2.1); DefaultConfig holds the spec's lists.
type Config struct {
	SessionHeaders      []string // first match wins
	SessionBodyFields   []string // dotted paths, e.g. metadata.session_id
	TenantHeaders       []string
	PrefixChars         int  // characters of the system prompt hashed (4096)
	DefaultOutputTokens int  // when max_tokens / max_completion_tokens is absent
	PromptBlocks        bool // also compute tokenize block hashes (cache-aware policies)
}

// MaxKeyBytes bounds a session key or tenant id: a longer one is replaced by
// "sha256:" and 32 hex digits of its hash, so keys stay small in the pin
// table, logs and admin JSON.
const MaxKeyBytes = 256

// maxModelBytes bounds the model name; longer names are rejected.
const maxModelBytes = 512

// maxOutputTokens caps an expected output so absurd max_tokens values cannot
// overflow load weights; the replica rejects them anyway.
const maxOutputTokens = 1 << 24

// DefaultConfig returns the key sources of SPEC s2.1 and the seeds' defaults.
// The body field metadata.user_id yields only the session_<uuid> part of a
// Claude Code user id (user_<hash>_account_<id>_session_<uuid>).
func DefaultConfig() Config {
	return Config{
		SessionHeaders: []string{
			"x-session-id", "x-claude-code-session-id", "x-kilocode-taskid",
			"x-cursor-conversation-id", "helicone-session-id", "session-id", "thread-id",
		},
		SessionBodyFields: []string{
			"prompt_cache_key", "conversation_id", "thread_id", "session_id",
			"metadata.session_id", "metadata.user_id",
		},
		TenantHeaders:       []string{"x-project-id", "x-kilocode-projectid"},
		PrefixChars:         4096,
		DefaultOutputTokens: 256,
	}
}

// Validate reports the first invalid setting, naming its YAML key.
func (c Config) Validate() error {
	for _, list := range []struct {
		key   string
		names []string
	}{
		{"request.session_headers", c.SessionHeaders},
		{"request.tenant_headers", c.TenantHeaders},
	} {
		for i, name := range list.names {
			if !validHeaderName(name) {
				return fmt.Errorf("request: %s[%d]: %q is not a valid HTTP header name", list.key, i, name)
			}
		}
	}
	for i, path := range c.SessionBodyFields {
		if path == "" || slicesContainEmpty(strings.Split(path, ".")) {
			return fmt.Errorf("request: request.session_body_fields[%d]: %q is not a dotted field path like metadata.session_id", i, path)
		}
	}
	if c.PrefixChars <= 0 {
		return fmt.Errorf("request: request.prefix_chars: %d must be positive", c.PrefixChars)
	}
	if c.DefaultOutputTokens <= 0 {
		return fmt.Errorf("request: request.default_output_tokens: %d must be positive", c.DefaultOutputTokens)
	}
	return nil
}

func slicesContainEmpty(parts []string) bool {
	for _, p := range parts {
		if p == "" {
			return true
		}
	}
	return false
}

// validHeaderName reports whether s is an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return true
}

// badRequest is a client error: its message is meant for the client (the
// proxy puts it in the OpenAI error body) and it matches ErrBadRequest.
type badRequest struct {
	msg   string
	cause error
}

func (e *badRequest) Error() string        { return e.msg }
func (e *badRequest) Unwrap() error        { return e.cause }
func (e *badRequest) Is(target error) bool { return target == ErrBadRequest }

func badf(cause error, format string, args ...any) error {
	return &badRequest{msg: "request: " + fmt.Sprintf(format, args...), cause: cause}
}

// endpoint is what Parse knows how to read.
type endpoint int

const (
	endpointOther endpoint = iota
	endpointChat
	endpointCompletions
	endpointEmbeddings
	endpointMessages  // the Anthropic Messages API (vLLM serves it too)
	endpointResponses // the OpenAI Responses API
)

func endpointOf(path string) endpoint {
	switch strings.TrimSuffix(path, "/") {
	case "/v1/chat/completions":
		return endpointChat
	case "/v1/completions":
		return endpointCompletions
	case "/v1/embeddings":
		return endpointEmbeddings
	case "/v1/messages":
		return endpointMessages
	case "/v1/responses":
		return endpointResponses
	}
	return endpointOther
}

// Routed reports whether a POST to path is profiled by Parse and routed by
// its model, prompt and keys: chat and completions, embeddings, the
// Anthropic Messages API (Claude-style agents) and the Responses API
// (Codex-style agents). Other paths pass through on their headers alone.
func Routed(path string) bool { return endpointOf(path) != endpointOther }

// message is the part of a chat message routing reads.
type message struct {
	Role      string          `json:"role"`
	Content   any             `json:"content"` // string, array of parts or null: decoded in one pass
	ToolCalls json.RawMessage `json:"tool_calls"`
}

// Parse profiles one request. path is the URL path (/v1/chat/completions,
// /v1/completions, /v1/embeddings, ...). Errors wrap ErrBadRequest.
//
// Chat, completions and embeddings bodies must be JSON objects with a
// "model". Other paths (passed through by the proxy) are read leniently: a
// body that is not a JSON object, or has fields of unexpected types, is no
// error; what can be read is used. A zero PrefixChars or DefaultOutputTokens
// takes the default; empty key lists find no key.
func Parse(cfg Config, path string, header http.Header, body []byte) (Profile, error) {
	ep := endpointOf(path)
	def := DefaultConfig()
	if cfg.PrefixChars <= 0 {
		cfg.PrefixChars = def.PrefixChars
	}
	if cfg.DefaultOutputTokens <= 0 {
		cfg.DefaultOutputTokens = def.DefaultOutputTokens
	}
	p := Profile{OutputTokens: cfg.DefaultOutputTokens}
	b, err := decodeObject(body)
	if err != nil {
		if ep != endpointOther {
			return Profile{}, err
		}
		b = &requestBody{}
	}
	fields := b.fields

	if p.Model, err = parseModel(fields, ep != endpointOther); err != nil {
		return Profile{}, err
	}
	p.SessionKey = sessionKey(cfg, header, fields)

	var system, prompt string // prefix source and rendered prompt
	switch ep {
	case endpointChat:
		if system, prompt, p.PromptTokens, err = parseChat(b); err != nil {
			return Profile{}, err
		}
	case endpointCompletions:
		if prompt, p.PromptTokens, err = parsePrompt(fields, "prompt"); err != nil {
			return Profile{}, err
		}
		system = prompt
	case endpointEmbeddings:
		if _, p.PromptTokens, err = parsePrompt(fields, "input"); err != nil {
			return Profile{}, err
		}
	case endpointMessages:
		if system, prompt, p.PromptTokens, err = parseChat(b); err != nil {
			return Profile{}, err
		}
	case endpointResponses:
		// Its input takes many shapes (strings, messages, tool calls and
		// their outputs, reasoning items); none is an error here.
		system, prompt, p.PromptTokens = parseResponses(b)
	case endpointOther:
		// Best effort: a chat-like body still gives keys and estimates;
		// anything else is not an error.
		if sys, text, tokens, err := parseChat(b); err == nil {
			system, prompt, p.PromptTokens = sys, text, tokens
		}
	}
	if err := parseOutput(fields, &p); err != nil && ep != endpointOther {
		return Profile{}, err
	}
	if ep == endpointEmbeddings {
		p.OutputTokens = 0 // embeddings generate nothing
	}
	p.Stream = string(fields["stream"]) == "true"

	if system != "" {
		p.PrefixKey = prefixKey(system, cfg.PrefixChars, tenant(cfg, header))
	}
	if cfg.PromptBlocks && prompt != "" {
		p.PromptBlocks = tokenize.FromText(capText(prompt, MaxPromptBlockBytes)).Blocks
	}
	return p, nil
}

// requestBody is a request body decoded as far as routing needs: every top-level
// field raw, except "messages", which is decoded in the same pass (it holds
// nearly all the bytes, so it is scanned once rather than re-parsed).
type requestBody struct {
	fields      map[string]json.RawMessage
	messages    []message
	hasMessages bool  // "messages" present and not null
	messagesErr error // a type error inside "messages", reported by parseChat
}

// MaxPromptBlockBytes caps the prompt text hashed into blocks for the
// cache-aware policies (about 256K tokens, beyond the context of the models
// served): a longer common prefix cannot change which replica matches best,
// and the hashing of a huge prompt would cost every other client its CPU
// (issue 10, item 5). Token counts stay exact.
const MaxPromptBlockBytes = 1 << 20

// decodeObject reads the body's top level. Its values are sub-slices of
// body, not copies, so a 30 MB prompt costs no second 30 MB (issue 10, item
// 5), and each is validated once: "messages" (nearly all the bytes of a chat
// body) by decoding it at once, the others with json.Valid. A type error
// inside "messages" does not stop the other fields from being read. An
// invalid body is decoded again by decodeObjectErr, which says what is
// wrong (the slow path is for bad input only).
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
		name, ok := plainString(d[i:end])
		if !ok && json.Unmarshal(d[i:end], &name) != nil {
			return decodeObjectErr(data)
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
			var typeErr *json.UnmarshalTypeError
			if err != nil && !errors.As(err, &typeErr) {
				return decodeObjectErr(data)
			}
			b.messages, b.messagesErr, b.hasMessages = msgs, err, msgs != nil || err != nil
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
					if m.Role, ok = plainString(v); !ok {
						return nil, false
					}
				}
			case "content":
				if s, ok := plainString(v); ok {
					m.Content = s
				} else if json.Unmarshal(v, &m.Content) != nil {
					return nil, false
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

func parseModel(fields map[string]json.RawMessage, required bool) (string, error) {
	raw := fields["model"]
	if isNull(raw) {
		if required {
			return "", badf(nil, `missing "model"`)
		}
		return "", nil
	}
	model, ok := plainString(raw)
	if !ok {
		if err := json.Unmarshal(raw, &model); err != nil {
			if required {
				return "", badf(err, `"model" must be a string`)
			}
			return "", nil
		}
	}
	switch {
	case model == "" && required:
		return "", badf(nil, `"model" must not be empty`)
	case len(model) > maxModelBytes:
		return "", badf(nil, `"model" is longer than %d bytes`, maxModelBytes)
	case strings.IndexFunc(model, unicode.IsControl) >= 0:
		return "", badf(nil, `"model" contains control characters`)
	}
	return model, nil
}

// parseOutput sets the expected output tokens: max_completion_tokens, else
// max_tokens, else max_output_tokens (the Responses API's), else the
// configured default.
func parseOutput(fields map[string]json.RawMessage, p *Profile) error {
	for _, name := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		raw := fields[name]
		if isNull(raw) {
			continue
		}
		f, err := strconv.ParseFloat(string(raw), 64)
		if err != nil || f < 1 || f != math.Trunc(f) {
			return badf(err, "%q must be a positive integer", name)
		}
		p.OutputTokens = int(min(f, maxOutputTokens))
		return nil
	}
	return nil
}

// sessionKey returns the first session key found in the configured headers,
// then body fields (SPEC s2.1), sanitized.
func sessionKey(cfg Config, header http.Header, fields map[string]json.RawMessage) string {
	for _, name := range cfg.SessionHeaders {
		for _, v := range header[canonicalHeader(name)] {
			if k := sanitizeKey(v); k != "" {
				return k
			}
		}
	}
	for _, path := range cfg.SessionBodyFields {
		raw := lookup(fields, path)
		if isNull(raw) {
			continue
		}
		v, ok := scalarText(raw)
		if !ok {
			continue
		}
		if path == "user_id" || strings.HasSuffix(path, ".user_id") {
			v = claudeCodeSession(v)
		}
		if k := sanitizeKey(v); k != "" {
			return k
		}
	}
	return ""
}

// lookup follows a dotted path through nested objects; nil when absent.
func lookup(fields map[string]json.RawMessage, path string) json.RawMessage {
	name, rest, nested := strings.Cut(path, ".")
	raw := fields[name]
	for nested && !isNull(raw) {
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return nil
		}
		name, rest, nested = strings.Cut(rest, ".")
		raw = obj[name]
	}
	return raw
}

// scalarText returns a JSON string's value or a number's literal.
func scalarText(raw json.RawMessage) (string, bool) {
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return string(raw), true
	}
	return "", false
}

// claudeCodeSession extracts the session part of a Claude Code
// metadata.user_id: "session_<uuid>" from
// "user_<hash>_account_<id>_session_<uuid>", or the session_id of the JSON
// form newer versions send. Other user ids yield "": a user is not a session.
func claudeCodeSession(userID string) string {
	if i := strings.LastIndex(userID, "_session_"); i >= 0 {
		return userID[i+1:]
	}
	if strings.HasPrefix(strings.TrimSpace(userID), "{") {
		var v struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal([]byte(userID), &v) == nil && v.SessionID != "" {
			return "session_" + v.SessionID
		}
	}
	return ""
}

// sanitizeKey makes a client-supplied key safe for logs, headers and admin
// JSON: surrounding space trimmed, control, format and invalid bytes
// dropped, and keys longer than MaxKeyBytes replaced by a hash.
func sanitizeKey(s string) string {
	s = strings.TrimSpace(s)
	clean := true
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			clean = false
			break
		}
	}
	if !clean {
		var b strings.Builder
		for i := 0; i < len(s); {
			r, size := utf8.DecodeRuneInString(s[i:])
			if !(r == utf8.RuneError && size == 1) && unicode.IsPrint(r) {
				b.WriteRune(r)
			}
			i += size
		}
		s = strings.TrimSpace(b.String())
	}
	if len(s) > MaxKeyBytes {
		sum := sha256.Sum256([]byte(s))
		return "sha256:" + hex.EncodeToString(sum[:16])
	}
	return s
}

// canonicalNames caches the canonical form of configured header names:
// http.Header.Values canonicalizes its argument on every call, which for
// the nine lower-case defaults was nine allocations a request (issue 14).
var canonicalNames sync.Map // name -> canonical name

func canonicalHeader(name string) string {
	if c, ok := canonicalNames.Load(name); ok {
		return c.(string)
	}
	c := textproto.CanonicalMIMEHeaderKey(name)
	canonicalNames.Store(name, c)
	return c
}

// tenant returns the first configured tenant header's sanitized value.
func tenant(cfg Config, header http.Header) string {
	for _, name := range cfg.TenantHeaders {
		for _, v := range header[canonicalHeader(name)] {
			if t := sanitizeKey(v); t != "" {
				return t
			}
		}
	}
	return ""
}

// prefixKey is the MD5 (hex) of the first chars characters of text, preceded
// by "tenant:" when there is a tenant, so tenants sharing a system prompt
// get distinct keys (SPEC s2).
func prefixKey(text string, chars int, tenant string) string {
	n := 0
	for i := range text {
		if n == chars {
			text = text[:i]
			break
		}
		n++
	}
	sum := md5.Sum([]byte(text))
	key := hex.EncodeToString(sum[:])
	if tenant != "" {
		key = tenant + ":" + key
	}
	return key
}

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
	var system strings.Builder
	for i, m := range b.messages {
		text, err := contentText(m.Content)
		if err != nil {
			return nil, "", badf(err, `"messages[%d].content" must be a string or an array of content parts`, i)
		}
		if m.Role == "system" || m.Role == "developer" {
			if system.Len() > 0 && text != "" {
				system.WriteByte('\n')
			}
			system.WriteString(text)
		}
		if !isNull(m.ToolCalls) {
			text += compactJSON(m.ToolCalls)
		}
		out = append(out, tokenize.Message{Role: m.Role, Content: text})
	}
	return out, system.String(), nil
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
		case "tool_use": // an Anthropic tool call: its name and input are prompt text
			b, _ := json.Marshal(p["input"])
			name, _ := p["name"].(string)
			return name + string(b), nil
		case "tool_result": // its content: a string or text blocks
			text, err := contentText(p["content"])
			if err != nil {
				return "", nil // an odd result is no error: its text is unknown
			}
			return text, nil
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

// topLevelSystem reads a system prompt given outside "messages": the
// Anthropic Messages API's "system" (string or text blocks) or the
// Responses API's "instructions". Both pass through the proxy.
func topLevelSystem(fields map[string]json.RawMessage) (string, error) {
	for _, name := range []string{"system", "instructions"} {
		raw := fields[name]
		if isNull(raw) {
			continue
		}
		var content any
		err := json.Unmarshal(raw, &content)
		text := ""
		if err == nil {
			text, err = contentText(content)
		}
		if err != nil {
			return "", badf(err, "%q must be a string or an array of text blocks", name)
		}
		if text != "" {
			return text, nil
		}
	}
	return "", nil
}

// parsePrompt reads a completions "prompt" or embeddings "input": a string,
// an array of strings (joined by newlines), or token ids (an array of
// integers or of such arrays; their compact JSON text stands for the
// prompt). It returns the text and the estimated tokens (the count of ids
// for token arrays). Token ids are counted in one pass over the bytes,
// never decoded into a slice, and only the first MaxPromptBlockBytes of
// their text are kept: 15M ids cost no 120 MB slice (issue 10, item 5).
func parsePrompt(fields map[string]json.RawMessage, name string) (text string, tokens int, err error) {
	raw := fields[name]
	if isNull(raw) {
		return "", 0, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, tokenize.CountText(s), nil
		}
	case '[':
		if first := jsontop.SkipSpace(raw, 1); first < len(raw) && raw[first] == '"' {
			var strs []string
			if json.Unmarshal(raw, &strs) == nil {
				s := strings.Join(strs, "\n")
				return s, tokenize.CountText(s), nil
			}
			break
		}
		if n, ok := countTokenIDs(raw); ok {
			return compactPrefix(raw, MaxPromptBlockBytes), n, nil
		}
	}
	return "", 0, badf(nil, "%q must be a string, an array of strings or an array of token ids", name)
}

// countTokenIDs counts the integers of a valid JSON array of integers, or
// of arrays of integers; ok is false for anything else.
func countTokenIDs(raw []byte) (n int, ok bool) {
	depth, idDepth, inNumber := 0, 0, false
	for _, c := range raw {
		switch {
		case c == '[':
			depth++
			if depth > 2 {
				return 0, false
			}
		case c == ']':
			depth--
			inNumber = false
		case c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n':
			inNumber = false
		case c >= '0' && c <= '9' || c == '-':
			if !inNumber {
				// Numbers sit at one depth only: [1,2] or [[1,2],[3]],
				// never [1,[2]] or [[1],2].
				if idDepth == 0 {
					idDepth = depth
				} else if depth != idDepth {
					return 0, false
				}
				n++
				inNumber = true
			}
		default: // fractions, exponents, strings, objects, literals
			return 0, false
		}
	}
	return n, true
}

// compactPrefix is the compact JSON text of a valid array of numbers (its
// whitespace dropped), at most limit bytes of it.
func compactPrefix(raw []byte, limit int) string {
	out := make([]byte, 0, min(len(raw), limit))
	for _, c := range raw {
		if len(out) == limit {
			break
		}
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			out = append(out, c)
		}
	}
	return string(out)
}

// capText cuts text to at most limit bytes, on a rune boundary.
func capText(text string, limit int) string {
	if len(text) <= limit {
		return text
	}
	for limit > 0 && !utf8.RuneStart(text[limit]) {
		limit--
	}
	return text[:limit]
}

// rawTokens estimates the tokens of a raw JSON value (tool definitions).
func rawTokens(raw json.RawMessage) int {
	if isNull(raw) {
		return 0
	}
	return tokenize.CountText(compactJSON(raw))
}

func compactJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}
