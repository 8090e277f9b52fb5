// Package modeltok holds the tokenizers configured per model
// (tokenizers[] in the configuration): with one, a request's prompt is
// tokenized as the engine serving the model tokenizes it (its chat
// template, then its tokenizer.json), so that its KV blocks can be hashed
// over the same token ids the engine reports in its KV cache events
// (docs/KV_EVENTS.md).
package modeltok

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/llmlb/llmlb/internal/hftok"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// Config names the tokenizer of some models.
type Config struct {
	// Models are the request "model" values the tokenizer serves.
	Models []string
	// Path is a model directory holding tokenizer.json and, for chat
	// requests, the chat template (chat_template.jinja, or chat_template
	// in tokenizer_config.json), as Hugging Face repositories lay them
	// out; or the path of a tokenizer.json, the template read beside it.
	Path string
}

// CacheBytes bounds each tokenizer's cache of already tokenized text
// segments (a conversation's earlier messages): 64 MiB.
const CacheBytes = 64 << 20

// Model is one model's tokenizer and chat template. It is safe for
// concurrent use.
type Model struct {
	tok  *hftok.Tokenizer
	chat *hftok.ChatTemplate // nil: chat prompts are not tokenized
}

// ErrNoChatTemplate is returned by ChatTokens for a model whose files have
// no chat template.
var ErrNoChatTemplate = errors.New("modeltok: the model has no chat template")

// ChatTokens renders msgs with the model's chat template (with the
// generation prompt, as vLLM renders a chat completion) and tokenizes the
// result without adding special tokens, as vLLM does.
func (m *Model) ChatTokens(msgs []tokenize.Message) ([]uint32, error) {
	if m.chat == nil {
		return nil, ErrNoChatTemplate
	}
	if m.chat.ContentFormat() != "string" || (!m.chat.HandlesDeveloperRole() && hasDeveloper(msgs)) {
		// vLLM hands this template content parts, or system messages
		// made of developer ones: the full rendering does as it does.
		type message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		}
		wire := make([]message, len(msgs))
		for i, msg := range msgs {
			wire[i] = message{msg.Role, msg.Content}
		}
		raw, err := json.Marshal(wire)
		if err != nil {
			return nil, err
		}
		return m.ChatRequestTokens(request.ChatRequest{Messages: raw})
	}
	hm := make([]hftok.Message, len(msgs))
	for i, msg := range msgs {
		hm[i] = hftok.Message{Role: msg.Role, Content: msg.Content}
	}
	text, err := m.chat.Render(hm)
	if err != nil {
		return nil, err
	}
	return m.tok.Encode(text)
}

func hasDeveloper(msgs []tokenize.Message) bool {
	for _, m := range msgs {
		if m.Role == "developer" {
			return true
		}
	}
	return false
}

// PromptTokens tokenizes a completion prompt with the special tokens the
// tokenizer adds (Llama 3's <|begin_of_text|>), as vLLM does.
func (m *Model) PromptTokens(prompt string) ([]uint32, error) {
	return m.tok.EncodeWithSpecialTokens(prompt)
}

// HasChatTemplate reports whether chat prompts can be tokenized.
func (m *Model) HasChatTemplate() bool { return m.chat != nil }

// Load reads one model's tokenizer from path (see Config.Path).
func Load(path string) (*Model, error) {
	dir, file := path, filepath.Join(path, "tokenizer.json")
	if st, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("modeltok: %w", err)
	} else if !st.IsDir() {
		dir, file = filepath.Dir(path), path
	}
	tok, err := hftok.LoadFile(file, hftok.Options{CacheBytes: CacheBytes})
	if err != nil {
		return nil, fmt.Errorf("modeltok: %s: %w", file, err)
	}
	m := &Model{tok: tok}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("modeltok: %w", err)
	}
	source, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("modeltok: %w", err)
	}
	if cfg == nil && source == nil {
		return m, nil // no template: completions only
	}
	if cfg == nil {
		cfg = []byte("{}")
	}
	chat, err := hftok.LoadChatTemplateSource(cfg, string(source))
	switch {
	case errors.Is(err, hftok.ErrNoChatTemplate):
		return m, nil // a base model: completions only
	case err != nil:
		return nil, fmt.Errorf("modeltok: %s: %w", dir, err)
	}
	if err := chat.SetDefaults([]byte(vllmDefaults)); err != nil {
		return nil, err
	}
	m.chat = chat
	return m, nil
}

// Set is the tokenizers of every configured model.
type Set struct {
	byModel map[string]*Model
	// about says what each configured entry renders, in config order.
	about []string
}

// Describe says, per tokenizers[] entry, how its models' chats are
// rendered: the chat template's content format and developer role as
// vLLM treats them, or completions only.
func (s *Set) Describe() []string {
	if s == nil {
		return nil
	}
	return s.about
}

// describe is Describe's line for one entry.
func describe(c Config, m *Model) string {
	what := "no chat template: completions only"
	if m.chat != nil {
		content := "content as a string"
		if m.chat.ContentFormat() == "openai" {
			content = "content as a list of text parts"
		}
		dev := "developer messages as system ones"
		if m.chat.HandlesDeveloperRole() {
			dev = "developer messages as they are"
		}
		what = "chat template, " + content + ", " + dev
		if m.chat.ToolUse() != m.chat {
			what += ", a tool_use template for tools"
		}
	}
	return fmt.Sprintf("%s (%s): %s", strings.Join(c.Models, ", "), c.Path, what)
}

// LoadAll reads every configured tokenizer, once per path; a model named
// twice (checked before anything is read), or a tokenizer that does not
// load, is an error naming its entry.
func LoadAll(cfgs []Config) (*Set, error) {
	first := map[string]int{}
	for i, c := range cfgs {
		for _, name := range c.Models {
			if j, dup := first[name]; dup {
				return nil, fmt.Errorf("tokenizers[%d]: model %q has a tokenizer already (tokenizers[%d])", i, name, j)
			}
			first[name] = i
		}
	}
	s := &Set{byModel: make(map[string]*Model)}
	byPath := map[string]*Model{}
	for i, c := range cfgs {
		m := byPath[c.Path]
		if m == nil {
			var err error
			if m, err = Load(c.Path); err != nil {
				return nil, fmt.Errorf("tokenizers[%d]: %w", i, err)
			}
			byPath[c.Path] = m
		}
		for _, name := range c.Models {
			s.byModel[name] = m
		}
		s.about = append(s.about, describe(c, m))
	}
	return s, nil
}

// Len is the number of models with a tokenizer.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.byModel)
}

// For returns model's tokenizer, or nil when it has none (request.Config's
// Tokenizer).
func (s *Set) For(model string) request.PromptTokenizer {
	if s == nil {
		return nil
	}
	if m := s.byModel[model]; m != nil {
		return m
	}
	return nil
}
