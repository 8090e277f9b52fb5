package hftok

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

// decodeBytes maps ids back to the bytes they stand for (byte-level BPE is
// lossless), for the round-trip check.
func decodeBytes(rev map[uint32]string, ids []uint32) []byte {
	var out []byte
	for _, id := range ids {
		out = append(out, rev[id]...)
	}
	return out
}

func reverseVocab(tk *Tokenizer) map[uint32]string {
	rev := make(map[uint32]string, len(tk.vocab)+64)
	for s, id := range tk.vocab {
		rev[id] = s
	}
	for _, set := range []*addedSet{&tk.raw, &tk.normed} {
		for _, l := range set.byFirst {
			for _, a := range l {
				rev[a.id] = a.content
			}
		}
	}
	return rev
}

// naiveBPE is the textbook algorithm: merge the lowest-ranked adjacent pair,
// leftmost first, until none applies. bpe must agree with it.
func naiveBPE(tk *Tokenizer, word string) []uint32 {
	if len(word) == 0 {
		return nil
	}
	if tk.ignoreMerges {
		if id, ok := tk.vocab[word]; ok {
			return []uint32{id}
		}
	}
	ids := make([]uint32, len(word))
	for i := 0; i < len(word); i++ {
		ids[i] = tk.byteID[word[i]]
	}
	for {
		best, bestRank := -1, uint32(0)
		var bestID uint32
		for i := 0; i+1 < len(ids); i++ {
			if m, ok := tk.merges[uint64(ids[i])<<32|uint64(ids[i+1])]; ok && (best < 0 || m.rank < bestRank) {
				best, bestRank, bestID = i, m.rank, m.newID
			}
		}
		if best < 0 {
			return ids
		}
		ids[best] = bestID
		ids = append(ids[:best+1], ids[best+2:]...)
	}
}

func FuzzEncode(f *testing.F) {
	tks, ref := models(f)
	for _, c := range ref.Cases {
		if len(c.Text) < 200 {
			f.Add([]byte(c.Text))
		}
	}
	f.Add([]byte{0xff, 0xfe, '<', '|', 'i', 'm', '_', 0x80})
	tk := tks["qwen2_5"]
	gpt2 := tks["gpt2"]
	rev, grev := reverseVocab(tk), reverseVocab(gpt2)
	f.Fuzz(func(t *testing.T, in []byte) {
		text := string(in)
		ids, err := tk.Encode(text)
		if err != nil {
			t.Fatalf("Encode: %v", err)
		}
		again, _ := tk.Encode(text)
		if !equalIDs(ids, again) {
			t.Fatalf("Encode is not deterministic on %q", text)
		}
		// Lossless: the ids spell the (valid, NFC per segment) text. NFC
		// over the whole text may differ where an added token splits a
		// combining sequence, so compare NFC of both sides.
		got := decodeBytes(rev, ids)
		want := norm.NFC.Bytes([]byte(validUTF8(text)))
		if !bytes.Equal(norm.NFC.Bytes(got), want) {
			t.Fatalf("round trip of %q gives %q", text, got)
		}
		gids, err := gpt2.Encode(text)
		if err != nil {
			t.Fatalf("gpt2 Encode: %v", err)
		}
		if got := decodeBytes(grev, gids); string(got) != validUTF8(text) {
			t.Fatalf("gpt2 round trip of %q gives %q", text, got)
		}
		// The heap-based merge agrees with the textbook loop on the raw
		// bytes taken as one word.
		if len(in) <= 64 {
			s := &scratch{}
			for _, m := range []*Tokenizer{tk, gpt2} {
				if got, want := m.bpe(nil, text, s), naiveBPE(m, text); !equalIDs(got, want) {
					t.Fatalf("bpe(%q) = %v, naive %v", text, got, want)
				}
			}
		}
	})
}

func FuzzChatTemplate(f *testing.F) {
	f.Add("A: {{ 'x' }}{%- if true %}B{% endif %}")
	f.Add("{% for m in messages %}{{ m.role }}: {{- m.content }}\n{% endfor %}{% raw %}{{-{% endraw %}")
	f.Add("{{ '}}{%-' }}{#- c -#}{{- 1 -}}")
	f.Fuzz(func(t *testing.T, src string) {
		fixed := dropAdjacentTrim(src)
		// The rewrite only ever drops a '-'.
		if len(fixed) > len(src) || strings.ReplaceAll(fixed, "-", "") != strings.ReplaceAll(src, "-", "") {
			t.Fatalf("dropAdjacentTrim(%q) = %q changes more than trims", src, fixed)
		}
		ct, err := NewChatTemplate(src, SpecialTokens{BOS: "<s>"})
		if err != nil {
			return
		}
		_, _ = ct.Render([]Message{{Role: "user", Content: "hi"}})
	})
}
