package hftok

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChatTemplateMatchesReference(t *testing.T) {
	tks, ref := models(t)
	cfg, err := os.ReadFile(filepath.Join("testdata", "qwen2_5", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	ct, err := LoadChatTemplate(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(ref.Chats) == 0 {
		t.Fatal("reference has no chats")
	}
	for i, c := range ref.Chats {
		got, err := ct.Render(c.Messages)
		if err != nil {
			t.Fatalf("chat %d: %v", i, err)
		}
		if got != c.Rendered {
			t.Errorf("chat %d rendered:\n%q\nwant\n%q", i, got, c.Rendered)
			continue
		}
		ids, err := tks[c.Model].Encode(got)
		if err != nil {
			t.Fatal(err)
		}
		if !equalIDs(ids, c.IDs) {
			t.Errorf("chat %d ids:\n got %v\nwant %v", i, ids, c.IDs)
		}
	}
}

func TestChatTemplateVariables(t *testing.T) {
	ct, err := NewChatTemplate(
		"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"+
			"{% if add_generation_prompt %}>{% endif %}{% if unk_token is defined %}U{% endif %}{{ eos_token }}",
		SpecialTokens{BOS: "<s>", EOS: "</s>"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := ct.Render([]Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "yo"}})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<s>[user:hi][assistant:yo]></s>"; got != want {
		t.Fatalf("got %q want %q", got, want)
	}
}

func TestChatTemplateRaiseException(t *testing.T) {
	ct, err := NewChatTemplate(
		"{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok",
		SpecialTokens{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ct.Render([]Message{{Role: "user", Content: "x"}}); err != nil || got != "ok" {
		t.Fatalf("got %q, %v", got, err)
	}
	_, err = ct.Render([]Message{{Role: "assistant", Content: "x"}})
	var te *TemplateError
	if !errors.As(err, &te) || te.Message != "Conversation must start with user" {
		t.Fatalf("err %v, want the template's own exception", err)
	}
}

func TestChatTemplateUnsupportedFeatureSaysSo(t *testing.T) {
	ct, err := NewChatTemplate("{{ messages[0].content | nosuchfilter }}", SpecialTokens{})
	if err == nil {
		_, err = ct.Render([]Message{{Role: "user", Content: "x"}})
	}
	if err == nil || !strings.Contains(err.Error(), jinjaLib) || !strings.Contains(err.Error(), "nosuchfilter") {
		t.Fatalf("err %v, want one naming the library and the filter", err)
	}
	if _, err := NewChatTemplate("{% nosuchtag %}", SpecialTokens{}); err == nil || !strings.Contains(err.Error(), jinjaLib) {
		t.Fatalf("err %v, want one naming the library", err)
	}
}

func TestLoadChatTemplateConfigs(t *testing.T) {
	cfg := `{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
		"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "{{ bos_token }}D{{ eos_token }}"}]}`
	ct, err := LoadChatTemplate([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	got, err := ct.Render(nil)
	if err != nil || got != "<s>D</s>" {
		t.Fatalf("got %q, %v", got, err)
	}
	if _, err := LoadChatTemplate([]byte(`{"eos_token": "x"}`)); err == nil {
		t.Fatal("a config without chat_template loaded")
	}
}

// TestChatTemplateWhitespaceLikeJinja2 pins templates where ardanlabs/jinja
// v1.8.0 alone trims differently from Jinja2; the wants are Jinja2 3.1.6's
// output with transformers' settings (scripts/tokref/check_jinja2.py).
func TestChatTemplateWhitespaceLikeJinja2(t *testing.T) {
	tests := []struct{ src, want string }{
		{"A: {{ 'x' }}{{- 'y' }}", "A: xy"},
		{"A: {% set y = 1 %}{%- if true %}B{% endif %}", "A: B"},
		{"A: {# c #}{%- if true %}B{% endif %}", "A: B"},
		{"A: {{ 'x' }}{{ 'z' }}{%- if true %}B{% endif %}", "A: xzB"},
		{"A: {{ 'x' }}\n{%- if true %}B{% endif %}", "A: xB"},
		{"{%- if true -%}A: {{ 'x' }}{%- endif -%}", "A: x"},
		{"{{ '}}{%-' }}  {%- if true %}B{% endif %}", "}}{%-B"},
		{"{% raw %}A {{ x }}{% endraw %} {{- 'q' }}", "A {{ x }}q"},
	}
	for _, tt := range tests {
		ct, err := NewChatTemplate(tt.src, SpecialTokens{})
		if err != nil {
			t.Fatalf("%q: %v", tt.src, err)
		}
		got, err := ct.Render(nil)
		if err != nil || got != tt.want {
			t.Errorf("%q renders %q (err %v), Jinja2 renders %q", tt.src, got, err, tt.want)
		}
	}
}

// TestJinjaModuleTemplatesMatchJinja2 renders the reference conversations
// with the chat templates ardanlabs/jinja ships in its own test data
// (DeepSeek, GLM, Kimi, Llama 3.2, Mistral, Qwen, Gemma, gpt-oss, ...) and
// compares them with Python Jinja2's renderings in testdata (written by
// scripts/tokref/check_jinja2.py --templates, date pinned).
func TestJinjaModuleTemplatesMatchJinja2(t *testing.T) {
	_, ref := models(t)
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ardanlabs/jinja").Output()
	if err != nil {
		t.Fatalf("locating the jinja module: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "testdata", "templates")
	b, err := os.ReadFile(filepath.Join("testdata", "jinja2_templates.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Vars      map[string]string   `json:"vars"`
		Templates map[string][]string `json:"templates"`
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Templates) < 17 {
		t.Fatalf("%d templates in jinja2_templates.json, want 17", len(want.Templates))
	}
	for name, renders := range want.Templates {
		src, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		ct, err := NewChatTemplate(string(src), SpecialTokens{BOS: want.Vars["bos_token"], EOS: want.Vars["eos_token"]})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ct.Pin(time.Date(2024, 7, 26, 0, 0, 0, 0, time.UTC), map[string]string{"date_string": want.Vars["date_string"]})
		for i, c := range ref.Chats {
			got, err := ct.Render(c.Messages)
			if err != nil || got != renders[i] {
				t.Errorf("%s chat %d: renders (err %v)\n%q\nJinja2 renders\n%q", name, i, err, got, renders[i])
			}
		}
	}
}
