// Package tokenize is llmlb's deterministic pseudo-tokenizer and prompt
// representation, shared by the simulated engine, the workload generators and
// the request profiler so that equal text prefixes give equal KV block hashes
// everywhere.
package tokenize

// BlockSize is the number of tokens in one KV-cache block, as in vLLM.
const BlockSize = 16

// Prompt is a prompt as the KV cache sees it: its length in tokens and the
// chained hash of every *full* block (len(Blocks) == Tokens/BlockSize). The
// hash of block i covers blocks 0..i (it chains its parent's hash), so two
// prompts share a cached block exactly when they share the whole prefix up to
// and including it. A partial last block has no hash and is never shared.
type Prompt struct {
	Tokens int
	Blocks []uint64
}

// Message is one chat message reduced to what the pseudo-tokenizer needs.
type Message struct {
	Role    string
	Content string
}

// FromText tokenizes text (about 4 characters a token) and hashes its blocks.
func FromText(text string) Prompt { panic("tokenize: FromText not implemented yet") }

// CountText returns the number of tokens FromText would give, without hashing.
func CountText(text string) int { panic("tokenize: CountText not implemented yet") }

// FromBlockKeys builds a prompt of the given token count from one content key
// per full block (len(keys) must be tokens/BlockSize); the keys are chained
// into block hashes. Workloads and trace readers use it to describe prompts
// without text.
func FromBlockKeys(tokens int, keys []uint64) Prompt {
	panic("tokenize: FromBlockKeys not implemented yet")
}

// RenderChat renders chat messages into the text the engine tokenizes (a fixed,
// vLLM-like chat template), so equal leading messages give equal prefixes.
func RenderChat(msgs []Message) string { panic("tokenize: RenderChat not implemented yet") }
