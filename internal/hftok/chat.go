package hftok

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// jinjaLib names the template engine in errors, so that a template the
// library cannot handle is reported as that and not as a bad template.
const jinjaLib = "github.com/ardanlabs/jinja v1.8.0"

// Message is one OpenAI-style chat message with text content.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatTemplate is a compiled chat template. It is safe for concurrent use.
type ChatTemplate struct {
	tmpl *jinja.Template
	// vars are the special-token variables transformers passes to the
	// template (its special_tokens_map: only the tokens that are set).
	vars map[string]string
	// clock is what strftime_now reads; nil: time.Now.
	clock func() time.Time
	// defaults are SetDefaults' variables (undefined: none).
	defaults jinja.Value
	// contentFormat is ContentFormat's; developer HandlesDeveloperRole's.
	contentFormat string
	developer     bool
	// toolUse is the template named "tool_use" in a tokenizer_config.json
	// that names its templates, for conversations with tools; nil: none.
	toolUse *ChatTemplate
}

// TemplateError is an error the template raised itself through
// raise_exception (a conversation the model does not accept), as opposed
// to one the template engine hit.
type TemplateError struct{ Message string }

func (e *TemplateError) Error() string { return "hftok: chat template: " + e.Message }

// SpecialTokens are the special-token variables a template may use.
// An empty string leaves the variable undefined, as transformers does
// for a token the tokenizer does not set.
type SpecialTokens struct {
	BOS, EOS, UNK, PAD string
}

// NewChatTemplate compiles a chat template source.
func NewChatTemplate(source string, tokens SpecialTokens) (ct *ChatTemplate, err error) {
	defer func() {
		if p := recover(); p != nil {
			ct, err = nil, fmt.Errorf("hftok: chat template: %s panicked compiling it: %v", jinjaLib, p)
		}
	}()
	tmpl, err := jinja.Compile(renameTojson(dropAdjacentTrim(source)))
	if err != nil {
		return nil, fmt.Errorf("hftok: chat template: %s cannot compile it: %w", jinjaLib, err)
	}
	vars := map[string]string{}
	for name, v := range map[string]string{
		"bos_token": tokens.BOS, "eos_token": tokens.EOS,
		"unk_token": tokens.UNK, "pad_token": tokens.PAD,
	} {
		if v != "" {
			vars[name] = v
		}
	}
	return &ChatTemplate{
		tmpl: tmpl, vars: vars,
		contentFormat: detectContentFormat(source),
		developer:     strings.Contains(source, `"developer"`) || strings.Contains(source, `'developer'`),
	}, nil
}

// LoadChatTemplateFile reads the chat template and special tokens from a
// tokenizer_config.json.
func LoadChatTemplateFile(path string) (*ChatTemplate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("hftok: %w", err)
	}
	return LoadChatTemplate(b)
}

// ErrNoChatTemplate is returned for a tokenizer_config.json without a
// chat_template (a base model's).
var ErrNoChatTemplate = errors.New("hftok: tokenizer_config.json has no chat_template")

// LoadChatTemplate reads the chat template and special tokens from the
// contents of a tokenizer_config.json. A chat_template given as a list of
// named templates uses the one named "default", as transformers does
// without tools.
func LoadChatTemplate(tokenizerConfig []byte) (*ChatTemplate, error) {
	return LoadChatTemplateSource(tokenizerConfig, "")
}

// LoadChatTemplateSource is LoadChatTemplate with the template's source
// given apart, as recent model repositories ship it (chat_template.jinja
// beside tokenizer_config.json, which keeps the special tokens). An empty
// source reads the template from tokenizerConfig.
func LoadChatTemplateSource(tokenizerConfig []byte, source string) (*ChatTemplate, error) {
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
		BOS          json.RawMessage `json:"bos_token"`
		EOS          json.RawMessage `json:"eos_token"`
		UNK          json.RawMessage `json:"unk_token"`
		PAD          json.RawMessage `json:"pad_token"`
	}
	if err := json.Unmarshal(tokenizerConfig, &cfg); err != nil {
		return nil, fmt.Errorf("hftok: tokenizer_config.json: %w", err)
	}
	toolSource := ""
	switch {
	case source != "":
	case isNull(cfg.ChatTemplate):
		return nil, ErrNoChatTemplate
	default:
		var err error
		if source, toolSource, err = templateSource(cfg.ChatTemplate); err != nil {
			return nil, err
		}
	}
	var toks SpecialTokens
	for _, f := range []struct {
		raw json.RawMessage
		dst *string
	}{{cfg.BOS, &toks.BOS}, {cfg.EOS, &toks.EOS}, {cfg.UNK, &toks.UNK}, {cfg.PAD, &toks.PAD}} {
		s, err := tokenString(f.raw)
		if err != nil {
			return nil, err
		}
		*f.dst = s
	}
	ct, err := NewChatTemplate(source, toks)
	if err != nil || toolSource == "" {
		return ct, err
	}
	if ct.toolUse, err = NewChatTemplate(toolSource, toks); err != nil {
		return nil, fmt.Errorf("hftok: the \"tool_use\" template: %w", err)
	}
	return ct, nil
}

// templateSource reads a chat_template value: a string, or a list of
// named templates of which the one named "default" is used, and the one
// named "tool_use" for conversations with tools (empty: none).
func templateSource(raw json.RawMessage) (source, toolUse string, err error) {
	if err := json.Unmarshal(raw, &source); err == nil {
		return source, "", nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", "", errors.New("hftok: chat_template is neither a string nor a list of named templates")
	}
	for _, n := range named {
		switch n.Name {
		case "default":
			source = n.Template
		case "tool_use":
			toolUse = n.Template
		}
	}
	if source == "" {
		return "", "", errors.New("hftok: chat_template list has no template named \"default\"")
	}
	return source, toolUse, nil
}

// tokenString reads a special token written as a string or as an added-token
// object ({"content": ...}).
func tokenString(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		return "", fmt.Errorf("hftok: special token %s is neither a string nor an object", raw)
	}
	return obj.Content, nil
}

// Pin fixes what the template sees of the world, for reproducible
// renderings (tests, reference outputs): strftime_now reads the time at,
// and vars are set as further string variables (date_string, as some
// callers pass it). It returns c.
func (c *ChatTemplate) Pin(at time.Time, vars map[string]string) *ChatTemplate {
	c.clock = func() time.Time { return at }
	for k, v := range vars {
		c.vars[k] = v
	}
	if c.toolUse != nil {
		c.toolUse.Pin(at, vars)
	}
	return c
}

// Render applies the template to messages with add_generation_prompt true
// and no tools, the prompt vLLM builds for a chat completion.
func (c *ChatTemplate) Render(messages []Message) (string, error) {
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(m.Role))
		d.AsDict().Set("content", jinja.NewString(m.Content))
		msgs[i] = d
	}
	return c.render(jinja.NewList(msgs), jinja.Undefined(), c.defaults)
}

// RenderJSON applies the template to a conversation given as JSON, as
// transformers' apply_chat_template takes it: messages, an array of
// message objects, and tools, an array of tool objects or nil (none).
// Objects keep their keys' order, numbers are read as Python reads them
// (integers and floats apart), so that tojson writes them back as
// Python does. With tools, a template named "tool_use" in
// tokenizer_config.json is used where there is one, as transformers does.
func (c *ChatTemplate) RenderJSON(messages, tools []byte) (string, error) {
	return c.RenderWith(messages, tools, nil)
}

// RenderWith is RenderJSON with further template variables: kwargs, a
// JSON object (nil: none) whose members are set after the standard ones
// and the defaults (SetDefaults), as the keyword arguments of
// apply_chat_template are (add_generation_prompt among them).
func (c *ChatTemplate) RenderWith(messages, tools, kwargs []byte) (string, error) {
	msgs, err := valueFromJSON(messages)
	if err != nil {
		return "", fmt.Errorf("hftok: messages: %w", err)
	}
	if !msgs.IsList() {
		return "", errors.New("hftok: messages is not an array")
	}
	tv := jinja.Undefined()
	if len(tools) > 0 {
		if tv, err = valueFromJSON(tools); err != nil {
			return "", fmt.Errorf("hftok: tools: %w", err)
		}
		if !tv.IsList() && !tv.IsNone() {
			return "", errors.New("hftok: tools is not an array")
		}
	}
	vars := c.defaults
	if len(kwargs) > 0 {
		kv, err := valueFromJSON(kwargs)
		if err != nil || !kv.IsDict() {
			return "", errors.New("hftok: template variables are not a JSON object")
		}
		if c.defaults.IsDict() {
			merged := jinja.NewDict()
			for _, src := range []*jinja.Dict{c.defaults.AsDict(), kv.AsDict()} {
				for _, k := range src.Keys {
					v, _ := src.Get(k)
					merged.AsDict().Set(k, v)
				}
			}
			kv = merged
		}
		vars = kv
	}
	if c.toolUse != nil && tv.IsList() {
		return c.toolUse.render(msgs, tv, vars)
	}
	return c.render(msgs, tv, vars)
}

// SetDefaults sets template variables every rendering gets after the
// standard ones, from a JSON object: what a serving engine passes to
// every chat (vLLM's continue_final_message and reasoning_effort).
func (c *ChatTemplate) SetDefaults(vars []byte) error {
	v, err := valueFromJSON(vars)
	if err != nil || !v.IsDict() {
		return errors.New("hftok: default template variables are not a JSON object")
	}
	c.defaults = v
	if c.toolUse != nil {
		c.toolUse.defaults = v
	}
	return nil
}

// render runs the template with the variables transformers passes: the
// messages, tools (None when there are none), add_generation_prompt, the
// special tokens, raise_exception and strftime_now.
func (c *ChatTemplate) render(messages, tools, kwargs jinja.Value) (out string, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = "", fmt.Errorf("hftok: chat template: %s panicked rendering it: %v", jinjaLib, p)
		}
	}()
	data := make(map[string]jinja.Value, len(c.vars)+8)
	for k, v := range c.vars {
		data[k] = jinja.NewString(v)
	}
	data["strftime_now"] = strftimeNow(c.clock)
	data[tojsonFilter] = pyTojson
	data["messages"] = messages
	if tools.IsUndefined() {
		tools = jinja.None()
	}
	data["tools"] = tools
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(true)
	if kwargs.IsDict() {
		d := kwargs.AsDict()
		for _, k := range d.Keys {
			data[k], _ = d.Get(k)
		}
	}
	var raised *TemplateError
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := "raise_exception called"
		if len(args) > 0 && args[0].IsString() {
			msg = args[0].AsString()
		} else if len(args) > 0 {
			msg = args[0].String()
		}
		raised = &TemplateError{Message: msg}
		return jinja.Undefined(), raised
	})
	out, err = c.tmpl.RenderValues(data)
	if err != nil {
		if raised != nil {
			return "", raised
		}
		if strings.Contains(err.Error(), "unknown filter") {
			return "", fmt.Errorf("hftok: chat template uses a filter %s lacks: %w", jinjaLib, err)
		}
		return "", fmt.Errorf("hftok: chat template: %s failed to render it: %w", jinjaLib, err)
	}
	return out, nil
}

// ToolUse is the template transformers uses for a conversation with tools
// (a list, even empty): the one named "tool_use" where the
// tokenizer_config.json names its templates so, else c.
func (c *ChatTemplate) ToolUse() *ChatTemplate {
	if c.toolUse != nil {
		return c.toolUse
	}
	return c
}

// ContentFormat is how vLLM passes message content to this template, as
// its content-format detection decides from the template's source:
// "openai" (a list of {"type": "text", "text": ...} parts) when the
// template loops over a message's content (for part in
// message['content'], or over a variable named content), else "string".
func (c *ChatTemplate) ContentFormat() string { return c.contentFormat }

// HandlesDeveloperRole reports whether the template names the "developer"
// role; vLLM turns developer messages into system ones for a template
// that does not.
func (c *ChatTemplate) HandlesDeveloperRole() bool { return c.developer }

var (
	// forMessages finds the loops over the messages (or a slice or
	// filter of them): their loop variable names a message.
	forMessages = regexp.MustCompile(`\{%-?\s*for\s+(\w+)\s+in\s+messages\b`)
	// setMessages finds variables assigned the messages.
	setMessages = regexp.MustCompile(`\{%-?\s*set\s+(\w+)\s*=\s*messages\b`)
	// forContent finds a loop over a bare variable named content.
	forContent = regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+content\s*-?%\}`)
)

// detectContentFormat is vLLM's content-format detection
// (_detect_content_format) on the template's text rather than its syntax
// tree: a loop over <message>.content or <message>['content'], where
// <message> is a loop variable over the messages or over a variable
// assigned them, or a loop over a variable named content.
func detectContentFormat(source string) string {
	if forContent.MatchString(source) {
		return "openai"
	}
	lists := []string{"messages"}
	for _, m := range setMessages.FindAllStringSubmatch(source, -1) {
		lists = append(lists, m[1])
	}
	var vars []string
	for _, list := range lists {
		re := forMessages
		if list != "messages" {
			re = regexp.MustCompile(`\{%-?\s*for\s+(\w+)\s+in\s+` + regexp.QuoteMeta(list) + `\b`)
		}
		for _, m := range re.FindAllStringSubmatch(source, -1) {
			vars = append(vars, m[1])
		}
	}
	for _, v := range vars {
		q := regexp.QuoteMeta(v)
		if regexp.MustCompile(`\{%-?\s*for\s+\w+\s+in\s+` + q + `(\.content\b|\[\s*['"]content['"]\s*\])`).MatchString(source) {
			return "openai"
		}
	}
	return "string"
}
