package workload

import (
	"crypto/md5"
	"encoding/hex"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// Content domains keep the block keys of system prompts, session streams,
// single requests and trace blocks apart, so that system prompt 5 and
// session 5 never produce the same key by accident.
const (
	domSystem uint64 = iota + 1
	domSession
	domRequest
	domMooncake
	domTraceRequest
	domBailian
)

// mix combines two words into one key.
func mix(a, b uint64) uint64 {
	return tokenize.Mix64(tokenize.Mix64(a+0x9e3779b97f4a7c15) ^ (b + 0x632be59bd9b4e019))
}

// contentID names one piece of content (a system prompt, a session's stream,
// a request's own tokens) within a salt (workload instance and seed).
func contentID(salt, domain, id uint64) uint64 {
	return mix(mix(salt, domain), id)
}

// blockKey is the content key of block j of the content named by id.
func blockKey(id uint64, j int) uint64 { return mix(id, uint64(j)) }

// md5Key renders a stable prefix key the way the profiler renders the MD5 of
// a system prompt: 32 lowercase hex digits, with the tenant joined in front
// when there is one.
func md5Key(tenant, content string) string {
	sum := md5.Sum([]byte(content))
	h := hex.EncodeToString(sum[:])
	if tenant == "" {
		return h
	}
	return tenant + "/" + h
}

// extendPrompt returns the prompt of the given length whose leading blocks
// have the already chained hashes prefix and whose remaining full blocks are
// the request's own, keyed blockKey(ownID, j). It equals
// tokenize.FromBlockKeys over the same keys (TestExtendPromptMatchesFromBlockKeys)
// but hashes only the new blocks: a session's turn copies its stream's
// hashes instead of rehashing ~1,000 blocks a request.
func extendPrompt(tokens int, prefix []uint64, ownID uint64) tokenize.Prompt {
	n := tokens / tokenize.BlockSize
	k := min(len(prefix), n)
	blocks := make([]uint64, n)
	copy(blocks, prefix[:k])
	parent := tokenize.RootHash
	if k > 0 {
		parent = blocks[k-1]
	}
	for j := k; j < n; j++ {
		parent = tokenize.ChainHash(parent, blockKey(ownID, j))
		blocks[j] = parent
	}
	return tokenize.Prompt{Tokens: tokens, Blocks: blocks}
}

// chain appends to hashes the chained hashes of keys.
func chain(hashes []uint64, keys ...uint64) []uint64 {
	parent := tokenize.RootHash
	if len(hashes) > 0 {
		parent = hashes[len(hashes)-1]
	}
	for _, k := range keys {
		parent = tokenize.ChainHash(parent, k)
		hashes = append(hashes, parent)
	}
	return hashes
}
