package request

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// Config lists where session and tenant keys come from, and the prompt
// settings Parse uses; DefaultConfig holds the lists of the clients llmlb
// knows.
type Config struct {
	SessionHeaders      []string // first match wins
	SessionBodyFields   []string // dotted paths, e.g. metadata.session_id
	TenantHeaders       []string
	PrefixChars         int  // characters of the system prompt hashed (4096)
	DefaultOutputTokens int  // when max_tokens / max_completion_tokens is absent
	PromptBlocks        bool // also compute tokenize block hashes (cache-aware policies)

	// Tokenizer returns a model's own tokenizer, or nil when it has none
	// (package modeltok). With one, and PromptBlocks, a chat, Anthropic
	// Messages, Responses API or completion prompt is tokenized as the
	// engine tokenizes it and its blocks are hashed over those token ids
	// (tokenize.FromTokenIDs); its token count is then exact. Nil: no
	// model has one.
	Tokenizer func(model string) PromptTokenizer
}

// ChatRequest is what of a chat completion request decides its prompt:
// the request's raw JSON values, nil when absent.
type ChatRequest struct {
	// Anthropic marks a request of the Anthropic Messages API: Messages
	// and Tools in its shapes, System its top-level system prompt and
	// OutputConfig its output_config (whose effort is a reasoning
	// effort).
	Anthropic            bool
	System, OutputConfig json.RawMessage

	// Responses marks a request of the OpenAI Responses API: Input and
	// Instructions are its input and instructions, Tools in its flat
	// shape, and Reasoning its reasoning object (whose effort is a
	// reasoning effort); Messages is unused.
	Responses                      bool
	Input, Instructions, Reasoning json.RawMessage

	Messages, Tools json.RawMessage
	// TemplateKwargs is chat_template_kwargs, further variables for the
	// chat template; ReasoningEffort is reasoning_effort, which vLLM
	// passes to the template too.
	TemplateKwargs, ReasoningEffort json.RawMessage
}

// PromptTokenizer tokenizes prompts as the engine serving a model does.
type PromptTokenizer interface {
	// ChatTokens renders chat messages with the model's chat template and
	// tokenizes the result.
	ChatTokens(msgs []tokenize.Message) ([]uint32, error)
	// ChatRequestTokens renders a chat request as the engine renders it,
	// tool definitions, tool calls and tool results included, and
	// tokenizes the result; an error when it cannot render it as the
	// engine does.
	ChatRequestTokens(req ChatRequest) ([]uint32, error)
	// PromptTokens tokenizes a completion prompt.
	PromptTokens(prompt string) ([]uint32, error)
}

// DefaultConfig returns the key sources of the agents and SDKs llmlb knows
// (their session and project headers and body fields) and the default
// key sources of docs/CONFIG.md. The body field metadata.user_id yields only the session_<uuid>
// part of a Claude Code user id (user_<hash>_account_<id>_session_<uuid>).
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

// withDefaults gives a zero or negative PrefixChars or DefaultOutputTokens
// its default: a Config built in code may leave them unset, and a zero
// prefix would give every prompt the same key.
func (c Config) withDefaults() Config {
	def := DefaultConfig()
	if c.PrefixChars <= 0 {
		c.PrefixChars = def.PrefixChars
	}
	if c.DefaultOutputTokens <= 0 {
		c.DefaultOutputTokens = def.DefaultOutputTokens
	}
	return c
}
