package modeltok

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/llmlb/llmlb/internal/testutil/qwentok"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// reference is the part of internal/hftok's reference ids these tests read:
// chats rendered by Jinja2 and tokenized by Hugging Face's tokenizers.
type reference struct {
	Chats []struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		IDs []uint32 `json:"ids"`
	} `json:"chats"`
}

func TestChatTokensMatchTheReference(t *testing.T) {
	m, err := Load(qwentok.Dir(t))
	if err != nil {
		t.Fatal(err)
	}
	if !m.HasChatTemplate() {
		t.Fatal("no chat template loaded")
	}
	data, err := os.ReadFile(filepath.Join("..", "hftok", "testdata", "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	n := 0
	for i, c := range ref.Chats {
		if c.Model != "qwen2_5" {
			continue
		}
		msgs := make([]tokenize.Message, len(c.Messages))
		for j, msg := range c.Messages {
			msgs[j] = tokenize.Message{Role: msg.Role, Content: msg.Content}
		}
		ids, err := m.ChatTokens(msgs)
		if err != nil {
			t.Fatalf("chat %d: %v", i, err)
		}
		if !slices.Equal(ids, c.IDs) {
			t.Errorf("chat %d: ids %v, want %v", i, ids, c.IDs)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no Qwen2.5 chat in the reference")
	}
}

func TestLoadLayouts(t *testing.T) {
	dir := qwentok.Dir(t)
	// A tokenizer.json given by path finds its template beside it.
	m, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil || !m.HasChatTemplate() {
		t.Fatalf("Load(tokenizer.json) = %v, template %v", err, m != nil && m.HasChatTemplate())
	}
	// chat_template.jinja wins over tokenizer_config.json's template.
	if err := os.WriteFile(filepath.Join(dir, "chat_template.jinja"), []byte("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := m.ChatTokens([]tokenize.Message{{Role: "user", Content: "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := m.tok.Encode("[user]hi")
	if !slices.Equal(ids, want) {
		t.Fatalf("chat_template.jinja not used: %v, want %v", ids, want)
	}
	// Without any template only completions are tokenized.
	bare := t.TempDir()
	data, _ := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err := os.WriteFile(filepath.Join(bare, "tokenizer.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	m, err = Load(bare)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.ChatTokens([]tokenize.Message{{Role: "user", Content: "hi"}}); err != ErrNoChatTemplate {
		t.Fatalf("chat without a template: %v", err)
	}
	if ids, err := m.PromptTokens("hello world"); err != nil || len(ids) == 0 {
		t.Fatalf("PromptTokens = %v, %v", ids, err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing path loaded")
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"model": {"type": "WordPiece"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("a WordPiece tokenizer loaded")
	}
	q := qwentok.Dir(t)
	_, err := LoadAll([]Config{{Models: []string{"a"}, Path: q}, {Models: []string{"b", "a"}, Path: q}})
	if err == nil || !strings.Contains(err.Error(), `tokenizers[1]: model "a" has a tokenizer already (tokenizers[0])`) {
		t.Fatalf("LoadAll with a model twice: %v", err)
	}
	s, err := LoadAll([]Config{{Models: []string{"a", "b"}, Path: q}, {Models: []string{"c"}, Path: q}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 3 || s.For("a") == nil || s.For("d") != nil || s.For("a") != s.For("c") {
		t.Fatalf("Set: len %d, a %v, c %v, d %v (one path is read once)", s.Len(), s.For("a"), s.For("c"), s.For("d"))
	}
	var none *Set
	if none.For("a") != nil || none.Len() != 0 {
		t.Fatal("a nil Set has tokenizers")
	}
}
