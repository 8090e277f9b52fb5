package proxy

import (
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// askUsage makes a streamed completion report its token usage
// (openai.AskUsage) when the request has a Trace: package server's observer
// counts the tokens and removes the usage chunk, which the client did not
// ask for. It records in the Trace that it did.
func askUsage(t *Trace, path string, prof *request.Profile, body []byte) []byte {
	if t == nil || !prof.Stream || !openai.CompletionsPath(path) {
		return body
	}
	out, asked := openai.AskUsage(body)
	if asked {
		t.UsageAsked = true
	}
	return out
}
