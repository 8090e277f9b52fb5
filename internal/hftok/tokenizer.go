package hftok

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"golang.org/x/text/unicode/norm"
)

// gpt2Pattern is the pattern of Hugging Face's ByteLevel pre-tokenizer when
// its use_regex is true (tokenizers' byte_level.rs, from GPT-2's encoder.py).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// DefaultMaxInputBytes bounds the text Encode accepts (after the chat
// template is applied): 8 MiB is 2 million tokens or more, far beyond any
// context window, and keeps the working memory of one call to a few tens of
// MiB.
const DefaultMaxInputBytes = 8 << 20

// ErrTooLong is returned by Encode for a text longer than the tokenizer's
// input limit.
var ErrTooLong = errors.New("hftok: text longer than the input limit")

// Tokenizer encodes text to token ids as a Hugging Face byte-level BPE
// tokenizer.json does. It is safe for concurrent use.
type Tokenizer struct {
	// vocab maps a token's raw bytes (the byte-level alphabet decoded) to
	// its id, for the tokens BPE can produce.
	vocab map[string]uint32
	// byteID is the id of the single-byte token for each byte.
	byteID [256]uint32
	// merges maps a pair of ids (left<<32 | right) to its merge.
	merges       map[uint64]merge
	ignoreMerges bool
	nfc          bool
	pattern      *regexp2.Regexp

	// raw are the added tokens matched on the text before normalization,
	// normed those matched after it (their content normalized), each
	// indexed by first byte with the longest first.
	raw, normed addedSet

	maxInput int
	cache    *segmentCache // nil without Options.CacheBytes
	post     postProcessor
	pool     sync.Pool
}

type merge struct {
	rank  uint32
	newID uint32
}

// Options adjust a loaded Tokenizer. The zero value is the default.
type Options struct {
	// MaxInputBytes is the longest text Encode accepts; 0 means
	// DefaultMaxInputBytes.
	MaxInputBytes int
	// CacheBytes bounds an LRU cache of the ids of text segments (the
	// runs between added tokens, such as one chat message); 0 disables
	// it. Cached or not, Encode returns the same ids.
	CacheBytes int
}

// LoadFile reads a tokenizer.json from path.
func LoadFile(path string, opts Options) (*Tokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hftok: %w", err)
	}
	return Load(b, opts)
}

// Load parses the contents of a tokenizer.json. It returns an error for a
// tokenizer outside the supported family (see the package comment).
func Load(data []byte, opts Options) (*Tokenizer, error) {
	var f struct {
		Truncation    json.RawMessage  `json:"truncation"`
		PostProcessor json.RawMessage  `json:"post_processor"`
		AddedTokens   []addedTokenJSON `json:"added_tokens"`
		Normalizer    json.RawMessage  `json:"normalizer"`
		PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
		Model         modelJSON        `json:"model"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("hftok: tokenizer.json: %w", err)
	}
	if !isNull(f.Truncation) {
		return nil, errors.New("hftok: tokenizer.json sets truncation; not supported")
	}
	t := &Tokenizer{maxInput: opts.MaxInputBytes}
	if t.maxInput <= 0 {
		t.maxInput = DefaultMaxInputBytes
	}
	if opts.CacheBytes > 0 {
		t.cache = newSegmentCache(opts.CacheBytes)
	}
	if err := t.loadNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err := t.loadPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err := t.loadModel(&f.Model); err != nil {
		return nil, err
	}
	if err := t.loadAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	t.post = loadPostProcessor(f.PostProcessor)
	return t, nil
}

func isNull(m json.RawMessage) bool {
	s := strings.TrimSpace(string(m))
	return s == "" || s == "null"
}

func (t *Tokenizer) loadNormalizer(m json.RawMessage) error {
	if isNull(m) {
		return nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(m, &n); err != nil {
		return fmt.Errorf("hftok: normalizer: %w", err)
	}
	switch {
	case n.Type == "NFC":
		t.nfc = true
		return nil
	case n.Type == "Sequence" && len(n.Normalizers) == 0:
		return nil
	case n.Type == "Sequence" && len(n.Normalizers) == 1:
		return t.loadNormalizer(n.Normalizers[0])
	}
	return fmt.Errorf("hftok: normalizer %q not supported (only null or NFC)", n.Type)
}

type byteLevelJSON struct {
	Type           string          `json:"type"`
	AddPrefixSpace bool            `json:"add_prefix_space"`
	UseRegex       *bool           `json:"use_regex"`
	Pattern        json.RawMessage `json:"pattern"`
	Behavior       string          `json:"behavior"`
	Invert         bool            `json:"invert"`
}

func (t *Tokenizer) loadPreTokenizer(m json.RawMessage) error {
	if isNull(m) {
		return errors.New("hftok: pre_tokenizer is null; only byte-level BPE is supported")
	}
	var p struct {
		byteLevelJSON
		PreTokenizers []json.RawMessage `json:"pretokenizers"`
	}
	if err := json.Unmarshal(m, &p); err != nil {
		return fmt.Errorf("hftok: pre_tokenizer: %w", err)
	}
	useRegex := func(b byteLevelJSON) bool { return b.UseRegex == nil || *b.UseRegex }
	var pattern string
	switch p.Type {
	case "ByteLevel":
		if p.AddPrefixSpace {
			return errors.New("hftok: ByteLevel add_prefix_space true not supported")
		}
		if !useRegex(p.byteLevelJSON) {
			return errors.New("hftok: ByteLevel without a regex and without a Split not supported")
		}
		pattern = gpt2Pattern
	case "Sequence":
		if len(p.PreTokenizers) != 2 {
			return fmt.Errorf("hftok: pre_tokenizer Sequence of %d; only Split + ByteLevel is supported", len(p.PreTokenizers))
		}
		var split, bl byteLevelJSON
		if err := json.Unmarshal(p.PreTokenizers[0], &split); err != nil {
			return fmt.Errorf("hftok: pre_tokenizer: %w", err)
		}
		if err := json.Unmarshal(p.PreTokenizers[1], &bl); err != nil {
			return fmt.Errorf("hftok: pre_tokenizer: %w", err)
		}
		if split.Type != "Split" || bl.Type != "ByteLevel" {
			return fmt.Errorf("hftok: pre_tokenizer Sequence of %s, %s; only Split + ByteLevel is supported", split.Type, bl.Type)
		}
		if split.Behavior != "Isolated" || split.Invert {
			return fmt.Errorf("hftok: Split behavior %q invert %v not supported (only Isolated, invert false)", split.Behavior, split.Invert)
		}
		var pat struct {
			Regex  *string `json:"Regex"`
			String *string `json:"String"`
		}
		if err := json.Unmarshal(split.Pattern, &pat); err != nil || pat.Regex == nil {
			return errors.New("hftok: Split pattern must be a Regex")
		}
		if bl.AddPrefixSpace || useRegex(bl) {
			return errors.New("hftok: ByteLevel after Split must have add_prefix_space false and use_regex false")
		}
		pattern = *pat.Regex
	default:
		return fmt.Errorf("hftok: pre_tokenizer %q not supported (only ByteLevel, or Sequence of Split + ByteLevel)", p.Type)
	}
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return fmt.Errorf("hftok: pre-tokenizer pattern: %w", err)
	}
	t.pattern = re
	return nil
}

type modelJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]int64  `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

func (t *Tokenizer) loadModel(m *modelJSON) error {
	if m.Type != "BPE" {
		return fmt.Errorf("hftok: model type %q not supported (only BPE)", m.Type)
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return errors.New("hftok: BPE dropout not supported")
	}
	if m.ByteFallback {
		return errors.New("hftok: BPE byte_fallback not supported")
	}
	if m.ContinuingSubwordPrefix != nil && *m.ContinuingSubwordPrefix != "" ||
		m.EndOfWordSuffix != nil && *m.EndOfWordSuffix != "" {
		return errors.New("hftok: BPE continuing_subword_prefix / end_of_word_suffix not supported")
	}
	t.ignoreMerges = m.IgnoreMerges
	t.vocab = make(map[string]uint32, len(m.Vocab))
	// byID holds the raw bytes of every byte-level token, for merges.
	byLevel := make(map[string]uint32, len(m.Vocab))
	for tok, id := range m.Vocab {
		if id < 0 || id > 1<<31 {
			return fmt.Errorf("hftok: vocab id %d out of range", id)
		}
		byLevel[tok] = uint32(id)
		if raw, ok := fromByteLevel(tok); ok {
			t.vocab[raw] = uint32(id)
		}
	}
	for b := 0; b < 256; b++ {
		id, ok := t.vocab[string([]byte{byte(b)})]
		if !ok {
			return fmt.Errorf("hftok: vocab lacks the byte-level token for byte %#x", b)
		}
		t.byteID[b] = id
	}
	t.merges = make(map[uint64]merge, len(m.Merges))
	for rank, raw := range m.Merges {
		var a, b string
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			parts := strings.Split(s, " ")
			if len(parts) != 2 {
				return fmt.Errorf("hftok: merge %d %q is not two tokens", rank, s)
			}
			a, b = parts[0], parts[1]
		} else {
			var pair []string
			if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
				return fmt.Errorf("hftok: merge %d is neither \"a b\" nor [a, b]", rank)
			}
			a, b = pair[0], pair[1]
		}
		ia, oka := byLevel[a]
		ib, okb := byLevel[b]
		in, okn := byLevel[a+b]
		if !oka || !okb || !okn {
			return fmt.Errorf("hftok: merge %d (%q %q) uses a token missing from the vocab", rank, a, b)
		}
		// As in tokenizers, a repeated merge keeps its last rank.
		t.merges[uint64(ia)<<32|uint64(ib)] = merge{rank: uint32(rank), newID: in}
	}
	return nil
}

// byteToRune is GPT-2's bytes_to_unicode table; runeToByte its inverse.
var byteToRune, runeToByte = byteLevelTables()

func byteLevelTables() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}

// fromByteLevel decodes a vocabulary entry written in the byte-level
// alphabet to the bytes it stands for.
func fromByteLevel(tok string) (string, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeToByte[r]
		if !ok {
			return "", false
		}
		out = append(out, b)
	}
	return string(out), len(out) > 0
}

// scratch is the per-call working memory, pooled.
type scratch struct {
	runes []rune
	syms  []symbol
	heap  []mergeItem
}

// Encode returns the token ids of text (add_special_tokens=False).
func (t *Tokenizer) Encode(text string) ([]uint32, error) {
	return t.AppendEncode(nil, text)
}

// AppendEncode appends the token ids of text to ids and returns the result.
func (t *Tokenizer) AppendEncode(ids []uint32, text string) ([]uint32, error) {
	if len(text) > t.maxInput {
		return ids, ErrTooLong
	}
	text = validUTF8(text)
	s, _ := t.pool.Get().(*scratch)
	if s == nil {
		s = &scratch{}
	}
	defer func() {
		// Keep pooled buffers small enough that a huge text does not pin
		// its working memory.
		if cap(s.runes) > 1<<16 {
			s.runes = nil
		}
		if cap(s.syms) > 1<<12 {
			s.syms, s.heap = nil, nil
		}
		t.pool.Put(s)
	}()
	var err error
	ids = t.raw.split(ids, text, func(ids []uint32, seg string) []uint32 {
		if err != nil {
			return ids
		}
		if t.nfc {
			seg = norm.NFC.String(seg)
		}
		return t.normed.split(ids, seg, func(ids []uint32, seg string) []uint32 {
			if err != nil {
				return ids
			}
			ids, err = t.cachedSegment(ids, seg, s)
			return ids
		})
	})
	return ids, err
}

// validUTF8 replaces every byte of an invalid UTF-8 sequence with U+FFFD, as
// encoding/json does when it decodes a request.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for _, r := range s {
		b.WriteRune(r)
	}
	return b.String()
}

// cachedSegment encodes a segment through the cache when there is one.
func (t *Tokenizer) cachedSegment(ids []uint32, seg string, s *scratch) ([]uint32, error) {
	if t.cache == nil || len(seg) < minCachedSegment {
		return t.encodeSegment(ids, seg, s)
	}
	key := sha256.Sum256([]byte(seg))
	if hit, ok := t.cache.get(key); ok {
		return append(ids, hit...), nil
	}
	n := len(ids)
	ids, err := t.encodeSegment(ids, seg, s)
	if err == nil {
		t.cache.put(key, ids[n:])
	}
	return ids, err
}

// encodeSegment pre-tokenizes a text without added tokens and BPE-encodes
// each piece.
func (t *Tokenizer) encodeSegment(ids []uint32, seg string, s *scratch) ([]uint32, error) {
	if seg == "" {
		return ids, nil
	}
	if cap(s.runes) < len(seg) {
		s.runes = make([]rune, 0, len(seg))
	}
	runes := s.runes[:0]
	for _, r := range seg {
		runes = append(runes, r)
	}
	s.runes = runes
	// Walk matches in order, tracking the byte offset of rune positions.
	curRune, curByte := 0, 0
	advance := func(to int) int {
		for ; curRune < to; curRune++ {
			curByte += utf8.RuneLen(runes[curRune])
		}
		return curByte
	}
	err := t.pattern.FindRunesMatches(runes, 0, func(m regexp2.MatchView) bool {
		idx, n, _ := m.GroupRange(0)
		if n == 0 {
			return true
		}
		start := curByte
		mstart := advance(idx)
		if mstart > start {
			ids = t.bpe(ids, seg[start:mstart], s)
		}
		mend := advance(idx + n)
		ids = t.bpe(ids, seg[mstart:mend], s)
		return true
	})
	if err != nil {
		return ids, fmt.Errorf("hftok: pre-tokenizer: %w", err)
	}
	if curByte < len(seg) {
		ids = t.bpe(ids, seg[curByte:], s)
	}
	return ids, nil
}
