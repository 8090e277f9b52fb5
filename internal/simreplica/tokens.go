package simreplica

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync"

	"github.com/llmlb/llmlb/internal/kvevents"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// Tokenizer tokenizes prompts as the engine serving a model does
// (package modeltok's Model).
type Tokenizer interface {
	ChatTokens(msgs []tokenize.Message) ([]uint32, error)
	PromptTokens(prompt string) ([]uint32, error)
}

// requestTokenizer is a Tokenizer that also renders a chat request's
// tools, tool calls and tool results (modeltok's Model does).
type requestTokenizer interface {
	ChatRequestTokens(req request.ChatRequest) ([]uint32, error)
}

// engineTokens is a replica that tokenizes with the model's own tokenizer
// (Options.Tokenizer): its blocks are hashed as vLLM hashes them, SHA-256
// over the parent block's hash and the block's token ids, chained from a
// seed that is random per process unless set (vLLM's NONE_HASH), so that
// nothing outside the replica can compute them; its KV cache events carry
// each stored block's token ids and parent, as vLLM's do.
type engineTokens struct {
	tok  Tokenizer
	seed [sha256.Size]byte

	mu sync.Mutex
	// cur and old remember each block hashed lately: its tokens and its
	// parent, for the events of its storing. Two generations of at most
	// rememberBlocks each bound the memory.
	cur, old map[uint64]blockTokens
}

// blockTokens is what a block's BlockStored event says of it.
type blockTokens struct {
	parent uint64
	root   bool // the prompt's first block: no parent
	ids    [tokenize.BlockSize]uint32
}

// rememberBlocks is one generation of remembered blocks.
const rememberBlocks = 1 << 18

func newEngineTokens(tok Tokenizer, seed string) *engineTokens {
	e := &engineTokens{tok: tok, cur: make(map[uint64]blockTokens)}
	if seed == "" {
		_, _ = rand.Read(e.seed[:])
	} else {
		e.seed = sha256.Sum256([]byte(seed))
	}
	return e
}

// prompt hashes token ids into the engine's blocks and remembers them.
func (e *engineTokens) prompt(ids []uint32) tokenize.Prompt {
	n := len(ids) / tokenize.BlockSize
	p := tokenize.Prompt{Tokens: len(ids), Blocks: make([]uint64, n)}
	parent := e.seed
	var buf [4 * tokenize.BlockSize]byte
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range n {
		var b blockTokens
		copy(b.ids[:], ids[i*tokenize.BlockSize:])
		b.root = i == 0
		if !b.root {
			b.parent = p.Blocks[i-1]
		}
		for j, id := range b.ids {
			binary.BigEndian.PutUint32(buf[4*j:], id)
		}
		h := sha256.New()
		h.Write(parent[:])
		h.Write(buf[:])
		h.Sum(parent[:0])
		// vLLM's events send a hash as the integer of its last 8 bytes.
		p.Blocks[i] = binary.BigEndian.Uint64(parent[sha256.Size-8:])
		if len(e.cur) >= rememberBlocks {
			e.old, e.cur = e.cur, make(map[uint64]blockTokens)
		}
		e.cur[p.Blocks[i]] = b
	}
	return p
}

func (e *engineTokens) lookup(h uint64) (blockTokens, bool) {
	if b, ok := e.cur[h]; ok {
		return b, true
	}
	b, ok := e.old[h]
	return b, ok
}

// requestAPI is the API a request body is in.
type requestAPI int

const (
	apiChat      requestAPI = iota
	apiAnthropic            // the Anthropic Messages API
	apiResponses            // the OpenAI Responses API
)

// chat tokenizes a chat request with the model's chat template: its
// messages, tools, tool calls and tool results where the tokenizer
// renders them, else the messages' roles and texts.
func (e *engineTokens) chat(msgs []chatMessage, body []byte) (tokenize.Prompt, error) {
	tm, err := chatMessages(msgs)
	if err != nil {
		return tokenize.Prompt{}, err
	}
	return e.request(tm, body, apiChat)
}

// messages tokenizes an Anthropic Messages request (its body) as vLLM
// serves it, turned into a chat, where the tokenizer renders those; else
// the roles and texts of tm with the model's chat template.
func (e *engineTokens) messages(tm []tokenize.Message, body []byte) (tokenize.Prompt, error) {
	return e.request(tm, body, apiAnthropic)
}

// responses tokenizes a Responses API request (its body) as vLLM serves
// it, turned into a chat, where the tokenizer renders those; else the
// roles and texts of tm with the model's chat template.
func (e *engineTokens) responses(tm []tokenize.Message, body []byte) (tokenize.Prompt, error) {
	return e.request(tm, body, apiResponses)
}

// request tokenizes a chat, Anthropic or Responses request body with the
// full rendering where the tokenizer has one and renders it, else the
// roles and texts of tm.
func (e *engineTokens) request(tm []tokenize.Message, body []byte, api requestAPI) (tokenize.Prompt, error) {
	if rt, ok := e.tok.(requestTokenizer); ok {
		var req struct {
			System          json.RawMessage `json:"system"`
			Messages        json.RawMessage `json:"messages"`
			Tools           json.RawMessage `json:"tools"`
			TemplateKwargs  json.RawMessage `json:"chat_template_kwargs"`
			ReasoningEffort json.RawMessage `json:"reasoning_effort"`
			OutputConfig    json.RawMessage `json:"output_config"`
			Input           json.RawMessage `json:"input"`
			Instructions    json.RawMessage `json:"instructions"`
			Reasoning       json.RawMessage `json:"reasoning"`
		}
		if json.Unmarshal(body, &req) == nil {
			cr := request.ChatRequest{Messages: req.Messages, Tools: req.Tools, TemplateKwargs: req.TemplateKwargs}
			switch api {
			case apiAnthropic:
				cr.Anthropic, cr.System, cr.OutputConfig = true, req.System, req.OutputConfig
			case apiResponses:
				cr = request.ChatRequest{Responses: true, Input: req.Input, Instructions: req.Instructions,
					Reasoning: req.Reasoning, Tools: req.Tools, TemplateKwargs: req.TemplateKwargs}
			default:
				cr.ReasoningEffort = req.ReasoningEffort
			}
			if ids, err := rt.ChatRequestTokens(cr); err == nil {
				return e.prompt(ids), nil
			}
		}
	}
	ids, err := e.tok.ChatTokens(tm)
	if err != nil {
		return tokenize.Prompt{}, err
	}
	return e.prompt(ids), nil
}

// completion tokenizes a completions prompt: a string or an array of one
// string with the tokenizer's special tokens, or token ids as they are.
func (e *engineTokens) completion(raw json.RawMessage) (tokenize.Prompt, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		var ss []string
		if err := json.Unmarshal(raw, &ss); err == nil && len(ss) == 1 {
			s = ss[0]
		} else {
			var ids []uint32
			if err := json.Unmarshal(raw, &ids); err != nil || len(ids) == 0 {
				return tokenize.Prompt{}, errors.New("prompt must be a string, an array of one string, or an array of token ids")
			}
			return e.prompt(ids), nil
		}
	}
	ids, err := e.tok.PromptTokens(s)
	if err != nil {
		return tokenize.Prompt{}, err
	}
	return e.prompt(ids), nil
}

// events gives stored blocks their token ids and parents, as vLLM's
// BlockStored events carry them: a run of stored blocks that is not one
// chain is split where the chain breaks, each part naming its parent.
func (e *engineTokens) events(evs []kvevents.Event) []kvevents.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]kvevents.Event, 0, len(evs))
	for _, ev := range evs {
		if ev.Kind != kvevents.BlockStored {
			out = append(out, ev)
			continue
		}
		var cur *kvevents.Event
		for i, h := range ev.BlockHashes {
			b, ok := e.lookup(h)
			if cur == nil || !ok || b.root || b.parent != ev.BlockHashes[i-1] {
				out = append(out, kvevents.Event{Kind: kvevents.BlockStored, BlockSize: tokenize.BlockSize, Medium: ev.Medium})
				cur = &out[len(out)-1]
				if ok && !b.root {
					cur.Parent, cur.HasParent = b.parent, true
				}
			}
			cur.BlockHashes = append(cur.BlockHashes, h)
			cur.TokenIDs = append(cur.TokenIDs, b.ids[:]...)
		}
	}
	return out
}
