package hftok

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

type reference struct {
	Tokenizers string `json:"tokenizers"`
	Cases      []struct {
		Text       string              `json:"text"`
		IDs        map[string][]uint32 `json:"ids"`
		IDsSpecial map[string][]uint32 `json:"ids_special"`
	} `json:"cases"`
	Chats []struct {
		Model    string    `json:"model"`
		Messages []Message `json:"messages"`
		Rendered string    `json:"rendered"`
		IDs      []uint32  `json:"ids"`
	} `json:"chats"`
}

func readGz(t testing.TB, path string) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	loadOnce sync.Once
	loaded   map[string][]byte
	loadedTk map[string]*Tokenizer
	loadErr  error
	ref      reference
)

// models loads the test tokenizers once per test binary (Qwen's file takes
// a few hundred milliseconds to parse).
func models(t testing.TB) (map[string]*Tokenizer, *reference) {
	t.Helper()
	loadOnce.Do(func() {
		loaded = map[string][]byte{
			"gpt2":    readGz(t, filepath.Join("testdata", "gpt2", "tokenizer.json.gz")),
			"qwen2_5": readGz(t, filepath.Join("testdata", "qwen2_5", "tokenizer.json.gz")),
		}
		var j map[string]any
		if loadErr = json.Unmarshal(loaded["qwen2_5"], &j); loadErr != nil {
			return
		}
		j["model"].(map[string]any)["ignore_merges"] = true
		b, err := json.Marshal(j)
		if err != nil {
			loadErr = err
			return
		}
		loaded["qwen2_5_ignore_merges"] = b
		// As scripts/tokref/gen.mjs: a TemplateProcessing post-processor
		// wrapping the sequence in <|endoftext|> ... <|im_end|>.
		j["model"].(map[string]any)["ignore_merges"] = false
		st := func(content string, id int) map[string]any {
			return map[string]any{"id": content, "ids": []int{id}, "tokens": []string{content}}
		}
		j["post_processor"] = map[string]any{"type": "Sequence", "processors": []any{
			map[string]any{"type": "ByteLevel"},
			map[string]any{
				"type": "TemplateProcessing",
				"single": []any{
					map[string]any{"SpecialToken": map[string]any{"id": "<|endoftext|>", "type_id": 0}},
					map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}},
					map[string]any{"SpecialToken": map[string]any{"id": "<|im_end|>", "type_id": 0}},
				},
				"special_tokens": map[string]any{"<|endoftext|>": st("<|endoftext|>", 151643), "<|im_end|>": st("<|im_end|>", 151645)},
			},
		}}
		if b, err = json.Marshal(j); err != nil {
			loadErr = err
			return
		}
		loaded["qwen2_5_template"] = b
		loadedTk = map[string]*Tokenizer{}
		for name, b := range loaded {
			tk, err := Load(b, Options{})
			if err != nil {
				loadErr = fmt.Errorf("%s: %w", name, err)
				return
			}
			loadedTk[name] = tk
		}
		rb, err := os.ReadFile(filepath.Join("testdata", "reference.json"))
		if err != nil {
			loadErr = err
			return
		}
		loadErr = json.Unmarshal(rb, &ref)
	})
	if loadErr != nil {
		t.Fatal(loadErr)
	}
	return loadedTk, &ref
}

func TestEncodeMatchesReference(t *testing.T) {
	tks, ref := models(t)
	if len(ref.Cases) < 40 {
		t.Fatalf("reference has %d cases, want at least 40", len(ref.Cases))
	}
	for name, tk := range tks {
		for i, c := range ref.Cases {
			want, ok := c.IDs[name]
			if !ok {
				t.Fatalf("case %d has no ids for %s", i, name)
			}
			got, err := tk.Encode(c.Text)
			if err != nil {
				t.Fatalf("%s case %d: %v", name, i, err)
			}
			if !equalIDs(got, want) {
				t.Errorf("%s case %d %q:\n got %v\nwant %v", name, i, short(c.Text), short2(got), short2(want))
			}
		}
	}
}

func TestEncodeWithSpecialTokensMatchesReference(t *testing.T) {
	tks, ref := models(t)
	n := 0
	for name, tk := range tks {
		for i, c := range ref.Cases {
			want, ok := c.IDsSpecial[name]
			if !ok {
				continue
			}
			n++
			got, err := tk.EncodeWithSpecialTokens(c.Text)
			if err != nil {
				t.Fatalf("%s case %d: %v", name, i, err)
			}
			if !equalIDs(got, want) {
				t.Errorf("%s case %d %q with special tokens:\n got %v\nwant %v", name, i, short(c.Text), short2(got), short2(want))
			}
		}
	}
	if n < 150 {
		t.Fatalf("only %d add_special_tokens references", n)
	}
}

func TestEncodeWithSpecialTokensRefusesUnknownPostProcessor(t *testing.T) {
	models(t)
	var j map[string]any
	if err := json.Unmarshal(loaded["gpt2"], &j); err != nil {
		t.Fatal(err)
	}
	j["post_processor"] = map[string]any{"type": "RobertaProcessing", "sep": []any{"</s>", 2}, "cls": []any{"<s>", 0}}
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Load(b, Options{})
	if err != nil {
		t.Fatalf("Load: %v (Encode does not need the post-processor)", err)
	}
	if _, err := tk.Encode("hi"); err != nil {
		t.Fatal(err)
	}
	if _, err := tk.EncodeWithSpecialTokens("hi"); err == nil {
		t.Fatal("EncodeWithSpecialTokens ignored an unsupported post-processor")
	}
}

func equalIDs(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func short2(ids []uint32) []uint32 {
	if len(ids) > 40 {
		return ids[:40]
	}
	return ids
}

func TestEncodeIsDeterministicAndConcurrent(t *testing.T) {
	tks, ref := models(t)
	tk := tks["qwen2_5"]
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, c := range ref.Cases {
				got, err := tk.Encode(c.Text)
				if err != nil || !equalIDs(got, c.IDs["qwen2_5"]) {
					t.Errorf("concurrent encode of %q differs (err %v)", short(c.Text), err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestLoadRejectsUnsupported(t *testing.T) {
	models(t)
	// A small Qwen-shaped file: Qwen's settings and added tokens, a vocab
	// of the 256 byte tokens and no merges, so each case parses fast.
	var small map[string]any
	if err := json.Unmarshal(loaded["qwen2_5"], &small); err != nil {
		t.Fatal(err)
	}
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteToRune[b])] = b
	}
	small["model"].(map[string]any)["vocab"] = vocab
	small["model"].(map[string]any)["merges"] = []any{}
	base, err := json.Marshal(small)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Load(base, Options{}); err != nil {
		t.Fatalf("the small base does not load: %v", err)
	}
	mutate := func(f func(j map[string]any)) []byte {
		var j map[string]any
		if err := json.Unmarshal(base, &j); err != nil {
			t.Fatal(err)
		}
		f(j)
		b, err := json.Marshal(j)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	model := func(j map[string]any) map[string]any { return j["model"].(map[string]any) }
	tests := []struct {
		name string
		f    func(j map[string]any)
	}{
		{"wordpiece", func(j map[string]any) { model(j)["type"] = "WordPiece" }},
		{"byte fallback", func(j map[string]any) { model(j)["byte_fallback"] = true }},
		{"dropout", func(j map[string]any) { model(j)["dropout"] = 0.1 }},
		{"NFKC", func(j map[string]any) { j["normalizer"] = map[string]any{"type": "NFKC"} }},
		{"lowercase", func(j map[string]any) { j["normalizer"] = map[string]any{"type": "Lowercase"} }},
		{"metaspace", func(j map[string]any) { j["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }},
		{"no pre-tokenizer", func(j map[string]any) { j["pre_tokenizer"] = nil }},
		{"split merged", func(j map[string]any) {
			j["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["behavior"] = "MergedWithPrevious"
		}},
		{"split invert", func(j map[string]any) {
			j["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)["invert"] = true
		}},
		{"prefix space", func(j map[string]any) {
			j["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[1].(map[string]any)["add_prefix_space"] = true
		}},
		{"lstrip", func(j map[string]any) { j["added_tokens"].([]any)[1].(map[string]any)["lstrip"] = true }},
		{"single word", func(j map[string]any) { j["added_tokens"].([]any)[1].(map[string]any)["single_word"] = true }},
		{"truncation", func(j map[string]any) { j["truncation"] = map[string]any{"max_length": 10} }},
		{"merge not in vocab", func(j map[string]any) { model(j)["merges"] = []any{"a b"} }},
		{"byte missing", func(j map[string]any) { delete(model(j)["vocab"].(map[string]any), "a") }},
		{"duplicate added", func(j map[string]any) {
			j["added_tokens"] = append(j["added_tokens"].([]any), j["added_tokens"].([]any)[0])
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Load(mutate(tt.f), Options{}); err == nil {
				t.Fatal("Load accepted an unsupported tokenizer")
			}
		})
	}
	if _, err := Load([]byte("{"), Options{}); err == nil {
		t.Fatal("Load accepted broken JSON")
	}
}

func TestMergesAsArrays(t *testing.T) {
	// Newer tokenizer.json files write merges as ["a", "b"].
	tks, ref := models(t)
	var j map[string]any
	if err := json.Unmarshal(loaded["gpt2"], &j); err != nil {
		t.Fatal(err)
	}
	m := j["model"].(map[string]any)
	for i, s := range m["merges"].([]any) {
		a, b, _ := bytes.Cut([]byte(s.(string)), []byte(" "))
		m["merges"].([]any)[i] = []string{string(a), string(b)}
	}
	b, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	tk, err := Load(b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = tks
	for _, c := range ref.Cases[:20] {
		got, _ := tk.Encode(c.Text)
		if !equalIDs(got, c.IDs["gpt2"]) {
			t.Fatalf("%q: got %v want %v", c.Text, got, c.IDs["gpt2"])
		}
	}
}

func TestEncodeLimits(t *testing.T) {
	b := readGz(t, filepath.Join("testdata", "gpt2", "tokenizer.json.gz"))
	tk, err := Load(b, Options{MaxInputBytes: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tk.Encode("01234567890"); err != ErrTooLong {
		t.Fatalf("Encode of 11 bytes with a 10-byte limit: err %v, want ErrTooLong", err)
	}
	if _, err := tk.Encode("0123456789"); err != nil {
		t.Fatal(err)
	}
}

func TestSegmentCacheGivesSameIDs(t *testing.T) {
	_, ref := models(t)
	const bound = 1 << 20
	tk, err := Load(loaded["qwen2_5"], Options{CacheBytes: bound})
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 2; round++ {
		for i, c := range ref.Cases {
			got, err := tk.Encode(c.Text)
			if err != nil || !equalIDs(got, c.IDs["qwen2_5"]) {
				t.Fatalf("round %d case %d %q: ids differ with the cache (err %v)", round, i, short(c.Text), err)
			}
			// A caller appending to the result must not corrupt the cache.
			_ = append(got, 1, 2, 3)
		}
		for i, c := range ref.Chats {
			got, err := tk.Encode(c.Rendered)
			if err != nil || !equalIDs(got, c.IDs) {
				t.Fatalf("round %d chat %d: ids differ with the cache (err %v)", round, i, err)
			}
		}
	}
	st := tk.CacheStats()
	if st.Hits == 0 || st.Misses == 0 {
		t.Fatalf("cache stats %+v: want hits and misses", st)
	}
	if st.Bytes > bound {
		t.Fatalf("cache holds %d bytes, over its bound", st.Bytes)
	}

	// A small cache evicts and stays within its bound.
	small, err := Load(loaded["qwen2_5"], Options{CacheBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	long := ref.Cases[len(ref.Cases)-1]
	for round := 0; round < 2; round++ {
		got, err := small.Encode(long.Text)
		if err != nil || !equalIDs(got, long.IDs["qwen2_5"]) {
			t.Fatalf("round %d: long document ids differ with a small cache (err %v)", round, err)
		}
	}
	if st := small.CacheStats(); st.Bytes > 16<<10 || st.Entries == 0 {
		t.Fatalf("small cache stats %+v: want entries within 16 KiB", st)
	}
}

func TestEncodeHugeInputs(t *testing.T) {
	tks, _ := models(t)
	const n = 64 << 10
	inputs := map[string]string{
		"spaces":        strings.Repeat(" ", n),
		"spaces then a": strings.Repeat(" ", n) + "a",
		"newlines":      strings.Repeat("\n", n),
		"one word":      strings.Repeat("ab", n/2),
		"digits":        strings.Repeat("9", n),
		"punctuation":   strings.Repeat("!?", n/2),
		"invalid utf-8": strings.Repeat("\xff\xc3", n/2),
	}
	for name, tk := range tks {
		rev := reverseVocab(tk)
		for what, in := range inputs {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			ids, err := tk.Encode(in)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatalf("%s %s: %v", name, what, err)
			}
			if got := decodeBytes(rev, ids); string(got) != validUTF8(in) {
				t.Fatalf("%s %s: ids do not spell the input", name, what)
			}
			// Working memory is linear in the input: runes, symbols and
			// the merge heap, a few dozen bytes per input byte at most.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64*uint64(len(validUTF8(in)))+1<<20 {
				t.Errorf("%s %s: %d bytes allocated for %d bytes of input", name, what, alloc, len(in))
			}
		}
	}
}
