// Package tokenize is llmlb's deterministic pseudo-tokenizer and prompt
// representation, shared by the simulated engine, the workload generators and
// the request profiler so that equal text prefixes give equal KV block hashes
// everywhere.
//
// The pseudo-tokenizer cuts text into 4-byte chunks: token i is the i-th chunk
// (the last one may be shorter). Sixteen tokens (64 bytes) make a block; a
// block's content key is a hash of its 64 bytes and its block hash chains the
// parent block's hash with that key, as vLLM's automatic prefix caching does.
package tokenize

import "strings"

// BlockSize is the number of tokens in one KV-cache block, as in vLLM.
const BlockSize = 16

// CharsPerToken is how many bytes of text the pseudo-tokenizer puts in one
// token (about what BPE tokenizers give for English and code).
const CharsPerToken = 4

// RootHash is the parent hash of a prompt's first block (vLLM seeds the chain
// with a fixed NONE_HASH as well).
const RootHash uint64 = 0x6c6c6d6c62000001

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
func FromText(text string) Prompt {
	tokens := CountText(text)
	const blockBytes = BlockSize * CharsPerToken
	// A block is full when it has 16 tokens, even if the last token is a
	// short chunk at the end of the text.
	n := tokens / BlockSize
	p := Prompt{Tokens: tokens, Blocks: make([]uint64, n)}
	parent := RootHash
	for i := range n {
		parent = ChainHash(parent, KeyOfText(text[i*blockBytes:min((i+1)*blockBytes, len(text))]))
		p.Blocks[i] = parent
	}
	return p
}

// CountText returns the number of tokens FromText would give, without hashing.
func CountText(text string) int {
	return (len(text) + CharsPerToken - 1) / CharsPerToken
}

// FromBlockKeys builds a prompt of the given token count from one content key
// per full block (len(keys) must be tokens/BlockSize); the keys are chained
// into block hashes. Workloads and trace readers use it to describe prompts
// without text.
//
// Bad input does not panic: a negative token count is taken as 0, extra keys
// are ignored, and missing keys leave the trailing full blocks without hashes
// (they can then never be shared, like a partial block).
func FromBlockKeys(tokens int, keys []uint64) Prompt {
	if tokens < 0 {
		tokens = 0
	}
	n := min(tokens/BlockSize, len(keys))
	p := Prompt{Tokens: tokens, Blocks: make([]uint64, n)}
	parent := RootHash
	for i := range n {
		parent = ChainHash(parent, keys[i])
		p.Blocks[i] = parent
	}
	return p
}

// ChainHash returns the hash of a block from its parent block's hash (RootHash
// for a prompt's first block) and its content key. FromText and FromBlockKeys
// use it; it is exported so callers can extend a prompt block by block.
func ChainHash(parent, key uint64) uint64 {
	return Mix64(parent*0x9e3779b97f4a7c15 ^ Mix64(key+0x632be59bd9b4e019))
}

// KeyOfText is the content key of one block of text (FNV-1a over its bytes,
// finalised with a strong mixer so that nearby texts give distant keys).
func KeyOfText(s string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= prime
	}
	return Mix64(h)
}

// TokenRootHash is the parent hash of the first block of a prompt given
// as a model's token ids (FromTokenIDs). It differs from RootHash so that
// blocks hashed from token ids never meet blocks hashed from text.
const TokenRootHash uint64 = 0x6c6c6d6c62000002

// KeyOfTokens is the content key of one block of token ids (FNV-1a over
// the ids' little-endian bytes, finalised like KeyOfText). Prompts
// tokenized with the model's own tokenizer, and the blocks engines report
// in their KV cache events, are keyed by it, so that the two meet without
// reproducing the engine's own hash.
func KeyOfTokens(ids []uint32) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for _, id := range ids {
		for range 4 {
			h ^= uint64(id & 0xff)
			h *= prime
			id >>= 8
		}
	}
	return Mix64(h)
}

// FromTokenIDs hashes the full blocks of a prompt given as the model's
// token ids: block i chains blocks 0..i from TokenRootHash with
// KeyOfTokens, as the KV events index keys what engines report.
func FromTokenIDs(ids []uint32) Prompt {
	n := len(ids) / BlockSize
	p := Prompt{Tokens: len(ids), Blocks: make([]uint64, n)}
	parent := TokenRootHash
	for i := range n {
		parent = ChainHash(parent, KeyOfTokens(ids[i*BlockSize:(i+1)*BlockSize]))
		p.Blocks[i] = parent
	}
	return p
}

// Mix64 is the splitmix64 finaliser: a cheap, well-spread 64-bit mixer,
// shared by everything that derives keys or hashes from small integers.
func Mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// SharedBlocks returns how many leading block hashes a and b have in common,
// that is how many full blocks of b a cache holding a would serve.
func SharedBlocks(a, b Prompt) int {
	n := min(len(a.Blocks), len(b.Blocks))
	for i := range n {
		if a.Blocks[i] != b.Blocks[i] {
			return i
		}
	}
	return n
}

// RenderChat renders chat messages into the text the engine tokenizes (a fixed,
// vLLM-like chat template), so equal leading messages give equal prefixes.
// Each message becomes "<|role|>\ncontent\n"; an "<|assistant|>\n" header
// closes the prompt, as a generation prompt would.
func RenderChat(msgs []Message) string {
	var b strings.Builder
	size := len("<|assistant|>\n")
	for _, m := range msgs {
		size += len(m.Role) + len(m.Content) + 6
	}
	b.Grow(size)
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteByte('\n')
	}
	b.WriteString("<|assistant|>\n")
	return b.String()
}
