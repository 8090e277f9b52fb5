package openai

import (
	"net/http"
	"strings"
)

// API paths whose shape the balancer relies on.
const (
	// PathPrefix is where the API lives; the balancer relays nothing else.
	PathPrefix = "/v1/"
	// PathChatCompletions is the chat completions endpoint.
	PathChatCompletions = "/v1/chat/completions"
	// PathCompletions is the legacy text completions endpoint.
	PathCompletions = "/v1/completions"
	// PathMessages is the Anthropic-style Messages endpoint vLLM serves.
	PathMessages = "/v1/messages"
	// PathModels lists the served models; PathModels+"/{id}" is one.
	PathModels = "/v1/models"
)

// CheckPath returns the answer to a request path the balancer must not
// relay: one with a "." or ".." segment (the replica would resolve it to
// its own endpoints outside the API), or one outside PathPrefix. ok is
// true when the path may be relayed. path is the decoded URL path.
func CheckPath(path string) (a Answer, ok bool) {
	switch {
	case DotSegments(path):
		return Answer{Status: http.StatusBadRequest, Type: TypeInvalidRequest, Code: CodeInvalidPath,
			Message: "the path must not contain \".\" or \"..\" segments (also percent-encoded)"}, false
	case !strings.HasPrefix(path, PathPrefix):
		return Answer{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: CodeNotFound,
			Message: "unknown path " + path}, false
	}
	return Answer{}, true
}

// DotSegments reports whether a decoded URL path has a "." or ".."
// segment. Go's server does not clean paths for a plain Handler, and the
// replica would resolve them.
func DotSegments(path string) bool {
	for seg := range strings.SplitSeq(path, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}

// IsModelsPath reports whether path is PathModels or one model under it
// (PathModels+"/{id}"), which a GET the balancer answers itself.
func IsModelsPath(path string) bool {
	return path == PathModels || strings.HasPrefix(path, PathModels+"/")
}

// CompletionsPath reports whether path is chat or text completions: the
// endpoints whose streams take stream_options.include_usage and end with
// "data: [DONE]".
func CompletionsPath(path string) bool {
	return path == PathChatCompletions || path == PathCompletions
}

// FirstChunkIsToken reports whether path's SSE streams send nothing before
// the first generated token: chat and text completions, and vLLM's
// Messages API, which converts the chat stream. A Responses API stream
// opens with response.created before any token.
func FirstChunkIsToken(path string) bool {
	return CompletionsPath(path) || path == PathMessages
}
