package openai

// Usage is the usage object of a completion or of a stream's last chunk,
// with vLLM's prompt_tokens_details, in the order vLLM writes its fields.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails is Usage's prompt_tokens_details: how many of the
// prompt's tokens were served from the prefix cache.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// NewUsage is the usage of a request of prompt tokens, cached of them
// from the prefix cache, that generated completion tokens.
func NewUsage(prompt, completion, cached int) *Usage {
	return &Usage{
		PromptTokens:        prompt,
		CompletionTokens:    completion,
		TotalTokens:         prompt + completion,
		PromptTokensDetails: &PromptTokensDetails{CachedTokens: cached},
	}
}

// TokenCounts is the token usage a response reported, as it is counted.
type TokenCounts struct {
	PromptTokens, CachedTokens, CompletionTokens int64
	// CachedReported is set when the usage said how many prompt tokens
	// were cached (vLLM's prompt_tokens_details, sent only with
	// --enable-prompt-tokens-details), even 0: without it a 0 says nothing.
	CachedReported bool
}

// readUsage is what is read of a usage object: only the counted fields,
// so that a malformed field that is not counted (total_tokens) does not
// discard the rest.
type readUsage struct {
	PromptTokens        int64        `json:"prompt_tokens"`
	CompletionTokens    int64        `json:"completion_tokens"`
	PromptTokensDetails *readDetails `json:"prompt_tokens_details"`
	// The Anthropic Messages API's names: the prompt is input_tokens
	// plus the cache's reads and writes (a server that reports no cache
	// fields, as vLLM's /v1/messages did, counts it all in input_tokens).
	InputTokens              int64 `json:"input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
}

// readDetails is readUsage's prompt_tokens_details.
type readDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// counts is u as TokenCounts.
func (u *readUsage) counts() TokenCounts {
	c := TokenCounts{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
	if c.PromptTokens == 0 && c.CompletionTokens == 0 {
		c.PromptTokens = u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens
		c.CompletionTokens, c.CachedTokens = u.OutputTokens, u.CacheReadInputTokens
		return c
	}
	if d := u.PromptTokensDetails; d != nil {
		c.CachedTokens, c.CachedReported = d.CachedTokens, true
	}
	return c
}
