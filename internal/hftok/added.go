package hftok

import (
	"fmt"
	"sort"
	"strings"

	"golang.org/x/text/unicode/norm"
)

type addedTokenJSON struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type addedToken struct {
	content string
	id      uint32
}

// addedSet finds added tokens in text, leftmost-longest like the
// aho-corasick automaton of tokenizers' AddedVocabulary.
type addedSet struct {
	byFirst [256][]addedToken // longest first
	n       int
}

func (a *addedSet) add(content string, id uint32) {
	b := content[0]
	a.byFirst[b] = append(a.byFirst[b], addedToken{content: content, id: id})
	a.n++
}

func (a *addedSet) sort() {
	for i := range a.byFirst {
		l := a.byFirst[i]
		sort.SliceStable(l, func(x, y int) bool { return len(l[x].content) > len(l[y].content) })
	}
}

func (t *Tokenizer) loadAdded(list []addedTokenJSON) error {
	seen := make(map[string]bool, len(list))
	for _, tok := range list {
		if tok.SingleWord || tok.LStrip || tok.RStrip {
			return fmt.Errorf("hftok: added token %q sets single_word, lstrip or rstrip; not supported", tok.Content)
		}
		if tok.ID < 0 || tok.ID > 1<<31 {
			return fmt.Errorf("hftok: added token %q id %d out of range", tok.Content, tok.ID)
		}
		content := tok.Content
		set := &t.raw
		if tok.Normalized {
			set = &t.normed
			if t.nfc {
				content = norm.NFC.String(content)
			}
		}
		if content == "" {
			continue // tokenizers ignores an empty token
		}
		if seen[content] {
			return fmt.Errorf("hftok: added token %q appears twice; not supported", tok.Content)
		}
		seen[content] = true
		set.add(content, uint32(tok.ID))
	}
	t.raw.sort()
	t.normed.sort()
	return nil
}

// split calls text for every run of text between added tokens and appends
// the id of every added token, in order.
func (a *addedSet) split(ids []uint32, s string, text func([]uint32, string) []uint32) []uint32 {
	if a.n == 0 {
		return text(ids, s)
	}
	start := 0
	for i := 0; i < len(s); i++ {
		cands := a.byFirst[s[i]]
		if len(cands) == 0 {
			continue
		}
		for _, c := range cands {
			if strings.HasPrefix(s[i:], c.content) {
				if i > start {
					ids = text(ids, s[start:i])
				}
				ids = append(ids, c.id)
				start = i + len(c.content)
				i = start - 1
				break
			}
		}
	}
	if start < len(s) {
		ids = text(ids, s[start:])
	}
	return ids
}
