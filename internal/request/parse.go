package request

import (
	"errors"
	"net/http"
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

// Parse profiles one request. path is the URL path (/v1/chat/completions,
// /v1/completions, /v1/embeddings, ...). Errors wrap ErrBadRequest.
func Parse(cfg Config, path string, header http.Header, body []byte) (Profile, error) {
	panic("request: Parse not implemented yet")
}
