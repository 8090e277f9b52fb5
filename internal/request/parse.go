package request

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ErrBadRequest wraps every error caused by the client's request (HTTP 400).
var ErrBadRequest = errors.New("bad request")

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

// maxModelBytes bounds the model name; longer names are rejected.
const maxModelBytes = 512

// maxOutputTokens caps an expected output so absurd max_tokens values cannot
// overflow load weights; the replica rejects them anyway.
const maxOutputTokens = 1 << 24

// MaxPromptBlockBytes caps the prompt text hashed into blocks for the
// cache-aware policies (about 256K tokens, beyond the context of the models
// served): a longer common prefix cannot change which replica matches best,
// and the hashing of a huge prompt would cost every other client its CPU.
// Token counts stay exact.
const MaxPromptBlockBytes = 1 << 20

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
	cfg = cfg.withDefaults()
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

	system, prompt, tokens, err := readPrompt(ep, b) // prefix source and rendered prompt
	if err != nil {
		return Profile{}, err
	}
	p.PromptTokens = tokens
	if err := parseOutput(fields, &p); err != nil && ep != endpointOther {
		return Profile{}, err
	}
	if ep == endpointEmbeddings {
		p.OutputTokens = 0 // embeddings generate nothing
	}
	p.Stream = StreamFlag(fields["stream"])

	if system != "" {
		p.PrefixKey = prefixKey(system, cfg.PrefixChars, tenant(cfg, header))
	}
	if cfg.PromptBlocks && prompt != "" {
		promptBlocks(cfg, ep, b, prompt, &p)
	}
	return p, nil
}

// readPrompt reads the prompt in the endpoint's shape: system is the text
// the prefix key is taken from, prompt the rendered text the blocks are
// hashed from, tokens the prompt's estimated size. Only the endpoints that
// must be well-formed return an error.
func readPrompt(ep endpoint, b *requestBody) (system, prompt string, tokens int, err error) {
	switch ep {
	case endpointChat, endpointMessages:
		return parseChat(b)
	case endpointCompletions:
		// A completion's prompt is also its prefix source.
		prompt, tokens, err = parsePrompt(b.fields, "prompt")
		return prompt, prompt, tokens, err
	case endpointEmbeddings:
		// Only the input's size is kept: embeddings get no prefix key and
		// no prompt blocks.
		_, tokens, err = parsePrompt(b.fields, "input")
		return "", "", tokens, err
	case endpointResponses:
		// Its input takes many shapes (strings, messages, tool calls and
		// their outputs, reasoning items); none is an error here.
		system, prompt, tokens = parseResponses(b)
		return system, prompt, tokens, nil
	case endpointOther:
		// Best effort: a chat-like body still gives keys and estimates;
		// anything else is not an error.
		if system, prompt, tokens, err := parseChat(b); err == nil {
			return system, prompt, tokens, nil
		}
	}
	return "", "", 0, nil
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
		var err error
		if model, err = unmarshalString(raw); err != nil {
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

// unmarshalString is json.Unmarshal into a string. Its own function: the
// target would otherwise be allocated for every model name, also those
// plainString reads without it.
func unmarshalString(raw []byte) (string, error) {
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
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

// StreamFlag reads a "stream" value as vLLM does (pydantic's lax bool):
// true, the number 1 (1, 1.0, 1e0), or one of the strings "1", "on", "t",
// "true", "y", "yes" in any case. Anything else, including values vLLM
// refuses (2, "maybe"), is not a stream.
func StreamFlag(raw []byte) bool {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0:
		return false
	case string(raw) == "true":
		return true
	case raw[0] == '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return false
		}
		switch strings.ToLower(s) {
		case "1", "on", "t", "true", "y", "yes":
			return true
		}
		return false
	case raw[0] == '-' || ('0' <= raw[0] && raw[0] <= '9'):
		f, err := strconv.ParseFloat(string(raw), 64)
		return err == nil && f == 1
	}
	return false
}
