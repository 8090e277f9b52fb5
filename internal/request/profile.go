// Package request is what routing knows about one request (Profile) and how
// that is read from an OpenAI-compatible request (Parse). The benchmark
// builds Profiles directly from its workloads.
package request

// Profile is what routing needs to know about one request.
type Profile struct {
	Model        string   // "" matches every replica
	SessionKey   string   // "" when the request carries none
	PrefixKey    string   // MD5 of the system prompt's first 4096 chars, tenant joined; "" when none
	PromptTokens int      // estimated prompt tokens
	OutputTokens int      // expected output tokens
	PromptBlocks []uint64 // chained 16-token block hashes (tokenize.Prompt.Blocks); for cache-aware baselines
	TokenBlocks  bool     // PromptBlocks were hashed over the model's own token ids (Config.Tokenizer; tokenize.FromTokenIDs), not over the text
	Stream       bool     // the client asked for a stream ("stream": true, or a truthy value vLLM also streams: StreamFlag): the proxy's idle timeout applies from the start
}
