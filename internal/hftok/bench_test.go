package hftok

import (
	"fmt"
	"testing"
)

// benchPrompt builds a prompt of about n Qwen2.5 tokens from the reference
// document (prose, code, CJK, emoji and special tokens).
func benchPrompt(b *testing.B, tk *Tokenizer, doc string, n int) string {
	b.Helper()
	ids, err := tk.Encode(doc)
	if err != nil {
		b.Fatal(err)
	}
	text := ""
	for got := 0; got < n; got += len(ids) {
		text += doc
	}
	// Trim to about n tokens by bytes, proportionally.
	all, _ := tk.Encode(text)
	cut := len(text) * n / len(all)
	return text[:cut]
}

func BenchmarkEncode(b *testing.B) {
	tks, ref := models(b)
	doc := ref.Cases[len(ref.Cases)-1].Text
	for _, model := range []string{"qwen2_5", "gpt2"} {
		tk := tks[model]
		for _, n := range []int{2048, 32768} {
			text := benchPrompt(b, tk, doc, n)
			ids, _ := tk.Encode(text)
			b.Run(fmt.Sprintf("%s/%dK", model, n/1024), func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					if _, err := tk.Encode(text); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(len(ids)), "tokens")
			})
		}
	}
}

func BenchmarkChatRender(b *testing.B) {
	models(b)
	ct, err := LoadChatTemplateFile("testdata/qwen2_5/tokenizer_config.json")
	if err != nil {
		b.Fatal(err)
	}
	msgs := ref.Chats[1].Messages
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ct.Render(msgs); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEncodeChatCached encodes a rendered chat of about n tokens with
// the segment cache warm from the previous turn: every message but the
// new last one is a cache hit, as when a conversation grows a turn.
func BenchmarkEncodeChatCached(b *testing.B) {
	all, ref := models(b)
	tks := all["qwen2_5"]
	doc := ref.Cases[len(ref.Cases)-1].Text
	ct, err := LoadChatTemplateFile("testdata/qwen2_5/tokenizer_config.json")
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{2048, 32768} {
		tk, err := Load(loaded["qwen2_5"], Options{CacheBytes: 64 << 20})
		if err != nil {
			b.Fatal(err)
		}
		// Messages of 1000 characters (about 300 tokens) each, until the
		// conversation has n tokens.
		runes := []rune(doc)
		var msgs []Message
		for tokens := 0; tokens < n; {
			i := len(msgs) * 1000 % (len(runes) - 1000)
			role := "user"
			if len(msgs)%2 == 1 {
				role = "assistant"
			}
			msgs = append(msgs, Message{Role: role, Content: fmt.Sprintf("turn %d: %s", len(msgs), string(runes[i:i+1000]))})
			p, err := ct.Render(msgs)
			if err != nil {
				b.Fatal(err)
			}
			ids, _ := tks.Encode(p)
			tokens = len(ids)
		}
		prev, err := ct.Render(msgs[:len(msgs)-1])
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tk.Encode(prev); err != nil {
			b.Fatal(err)
		}
		prompt, err := ct.Render(msgs)
		if err != nil {
			b.Fatal(err)
		}
		ids, _ := tk.Encode(prompt)
		b.Run(fmt.Sprintf("qwen2_5/%dK", n/1024), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tk.Encode(prompt); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ids)), "tokens")
		})
	}
}
