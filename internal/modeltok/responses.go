package modeltok

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/llmlb/llmlb/internal/jsontop"
	"github.com/llmlb/llmlb/internal/request"
)

// responsesChat turns an OpenAI Responses API request into the chat
// request vLLM renders for it (vllm/entrypoints/openai/responses/:
// serving.py's _make_request, utils.py's construct_input_messages and
// construct_tool_dicts, protocol.py's build_chat_params), for the parts
// that shape the prompt:
//   - the instructions, when not empty, as a first system message;
//   - a string input as one user message;
//   - of a list of items: a user, system or developer message as it is,
//     its input_text parts as text parts; an assistant message as an
//     assistant message whose content is its string, or the text of its
//     first part; a function_call as an assistant message with that tool
//     call (id its call_id, name its namespace and name joined by "__",
//     arguments its JSON string), added to the assistant message before
//     it when there is one; an assistant message right after a tool call
//     becomes that message's content when it has none; a
//     function_call_output as a tool message (tool_call_id its call_id,
//     content its output);
//   - each function tool as a chat function (name, description,
//     parameters, strict), tools of other types left out as vLLM leaves
//     them out;
//   - reasoning.effort as the reasoning effort, chat_template_kwargs as
//     they are; the generation prompt on.
//
// What vLLM would answer with an error, render from state or data llmlb
// does not see, or render differently from release to release is
// refused with ErrNotRendered: reasoning items (vLLM releases read them
// differently; encrypted ones are refused), items of other types (item
// references, calls of built-in tools), images and files, refusals, a
// last message still in progress (vLLM continues it instead of opening
// a new turn), namespace tools, a list of tools none of which is a
// function. The caller refuses what needs the server's state
// (previous_response_id and the like) before it gets here.
func responsesChat(req request.ChatRequest) (request.ChatRequest, error) {
	var msgs []responsesMessage
	if !isNull(req.Instructions) {
		s, ok := jsonString(req.Instructions)
		if !ok {
			return req, fmt.Errorf("%w: instructions is not a string", ErrNotRendered)
		}
		if s != "" {
			msgs = append(msgs, responsesMessage{Role: "system", Content: mustString(s)})
		}
	}
	switch {
	case isNull(req.Input):
		return req, fmt.Errorf("%w: no input", ErrNotRendered)
	case req.Input[0] == '"':
		s, ok := jsonString(req.Input)
		if !ok {
			return req, fmt.Errorf("%w: input is not a string", ErrNotRendered)
		}
		msgs = append(msgs, responsesMessage{Role: "user", Content: mustString(s)})
	default:
		var err error
		n := 0
		var last responsesItem
		ok := jsontop.Elements(req.Input, func(raw []byte) bool {
			var it responsesItem
			if !jsontop.Members(raw, it.set) {
				err = errors.New("not an object")
			} else {
				msgs, err = it.appendTo(msgs)
			}
			if err != nil {
				err = fmt.Errorf("%w: input[%d]: %v", ErrNotRendered, n, err)
				return false
			}
			last = it
			n++
			return true
		})
		if !ok {
			if err == nil {
				err = fmt.Errorf("%w: input is neither a string nor a list of items", ErrNotRendered)
			}
			return req, err
		}
		if n == 0 {
			return req, fmt.Errorf("%w: no input items", ErrNotRendered)
		}
		if last.continued() {
			return req, fmt.Errorf("%w: the last message is %s: vLLM continues it", ErrNotRendered, last.Status)
		}
	}
	messages, err := json.Marshal(msgs)
	if err != nil {
		return req, fmt.Errorf("%w: %v", ErrNotRendered, err)
	}
	out := request.ChatRequest{Messages: messages, TemplateKwargs: req.TemplateKwargs}
	if out.Tools, err = responsesTools(req.Tools); err != nil {
		return req, err
	}
	if !isNull(req.Reasoning) {
		var effort json.RawMessage
		if !jsontop.Members(req.Reasoning, func(k, v []byte) bool {
			if string(k) == "effort" {
				effort = v
			}
			return true
		}) {
			return req, fmt.Errorf("%w: reasoning is not an object", ErrNotRendered)
		}
		if !isNull(effort) {
			if _, ok := jsonString(effort); !ok {
				return req, fmt.Errorf("%w: reasoning.effort is not a string", ErrNotRendered)
			}
			out.ReasoningEffort = effort
		}
	}
	return out, nil
}

// responsesMessage is one chat message made of Responses items, in the
// shape vllmConversation reads. A nil Content is no content (None, not
// the empty string): the content an assistant message following it may
// give it.
type responsesMessage struct {
	Role       string             `json:"role"`
	Content    json.RawMessage    `json:"content,omitempty"`
	ToolCalls  []responsesToolUse `json:"tool_calls,omitempty"`
	ToolCallID json.RawMessage    `json:"tool_call_id,omitempty"`
}

// responsesToolUse is a chat tool call made of a function_call item.
type responsesToolUse struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

// responsesItem is the part of an input item the conversion reads, its
// members matched exactly, as pydantic matches them.
type responsesItem struct {
	Type, Role, Content, Status        json.RawMessage
	CallID, Name, Namespace, Arguments json.RawMessage
	Output                             json.RawMessage
	hasType                            bool
}

func (it *responsesItem) set(key, value []byte) bool {
	switch string(key) {
	case "type":
		it.Type, it.hasType = value, true
	case "role":
		it.Role = value
	case "content":
		it.Content = value
	case "status":
		it.Status = value
	case "call_id":
		it.CallID = value
	case "name":
		it.Name = value
	case "namespace":
		it.Namespace = value
	case "arguments":
		it.Arguments = value
	case "output":
		it.Output = value
	}
	return true
}

// continued reports whether vLLM continues this item, the request's last,
// rather than opening a new assistant turn (should_continue_final_message):
// a message or reasoning item in progress or incomplete.
func (it *responsesItem) continued() bool {
	typ, _ := jsonString(it.Type)
	if it.hasType && typ != "message" && typ != "reasoning" {
		return false
	}
	status, _ := jsonString(it.Status)
	return status == "in_progress" || status == "incomplete"
}

// appendTo adds the item to the chat messages made so far, as vLLM's
// _construct_message_from_response_item does.
func (it *responsesItem) appendTo(msgs []responsesMessage) ([]responsesMessage, error) {
	var prev *responsesMessage // the last message, when an assistant's
	if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
		prev = &msgs[n-1]
	}
	typ, ok := jsonString(it.Type)
	if it.hasType && !ok {
		return nil, errors.New("a type that is not a string")
	}
	switch typ {
	case "function_call":
		var call responsesToolUse
		var name, namespace string
		if call.ID, ok = jsonString(it.CallID); !ok {
			return nil, errors.New("a function_call without a string call_id")
		}
		if name, ok = jsonString(it.Name); !ok {
			return nil, errors.New("a function_call without a string name")
		}
		if call.Function.Arguments, ok = jsonString(it.Arguments); !ok {
			return nil, errors.New("a function_call without string arguments")
		}
		if !isNull(it.Namespace) {
			if namespace, ok = jsonString(it.Namespace); !ok {
				return nil, errors.New("a function_call whose namespace is not a string")
			}
		}
		if namespace != "" {
			name = namespace + "__" + name
		}
		call.Type, call.Function.Name = "function", name
		if prev != nil {
			prev.ToolCalls = append(prev.ToolCalls, call)
			return msgs, nil
		}
		return append(msgs, responsesMessage{Role: "assistant", ToolCalls: []responsesToolUse{call}}), nil
	case "function_call_output":
		id, ok := jsonString(it.CallID)
		if !ok {
			return nil, errors.New("a function_call_output without a string call_id")
		}
		var content json.RawMessage
		if s, ok := jsonString(it.Output); ok {
			content = mustString(s)
		} else {
			parts, err := inputTextParts(it.Output)
			if err != nil {
				return nil, fmt.Errorf("output: %v", err)
			}
			content = parts
		}
		return append(msgs, responsesMessage{Role: "tool", Content: content, ToolCallID: mustString(id)}), nil
	case "", "message":
	default:
		return nil, fmt.Errorf("a %q item", typ)
	}
	role, _ := jsonString(it.Role)
	switch role {
	case "assistant":
		text, err := assistantText(it.Content)
		if err != nil {
			return nil, err
		}
		if prev != nil && prev.Content == nil {
			prev.Content = mustString(text)
			return msgs, nil
		}
		return append(msgs, responsesMessage{Role: "assistant", Content: mustString(text)}), nil
	case "user", "system", "developer":
		var content json.RawMessage
		if s, ok := jsonString(it.Content); ok {
			content = mustString(s)
		} else {
			parts, err := inputTextParts(it.Content)
			if err != nil {
				return nil, err
			}
			content = parts
		}
		return append(msgs, responsesMessage{Role: role, Content: content}), nil
	}
	return nil, errors.New("a message without a user, system, developer or assistant role")
}

// assistantText is the text vLLM keeps of an assistant message's content:
// the string, or its first part's text ("" for no parts).
func assistantText(raw json.RawMessage) (string, error) {
	if s, ok := jsonString(raw); ok {
		return s, nil
	}
	var texts []string
	ok := jsontop.Elements(raw, func(v []byte) bool {
		t, s, ok := textPart(v)
		if !ok || (t != "output_text" && t != "input_text") {
			return false // refusals, images, files
		}
		texts = append(texts, s)
		return true
	})
	if !ok {
		return "", errors.New("an assistant message whose content is not a string or text parts")
	}
	if len(texts) == 0 {
		return "", nil
	}
	return texts[0], nil
}

// textPart reads a content part's type and text; ok is false when it is
// not an object or its text is not a string.
func textPart(v []byte) (typ, text string, ok bool) {
	var rawType, rawText json.RawMessage
	if !jsontop.Members(v, func(k, v []byte) bool {
		switch string(k) {
		case "type":
			rawType = v
		case "text":
			rawText = v
		}
		return true
	}) {
		return "", "", false
	}
	typ, _ = jsonString(rawType)
	text, ok = jsonString(rawText)
	return typ, text, ok
}

// inputTextParts turns a list of input_text parts into chat text parts,
// as vLLM reads them (its parser takes input_text for text).
func inputTextParts(raw json.RawMessage) (json.RawMessage, error) {
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	parts := []part{}
	ok := jsontop.Elements(raw, func(v []byte) bool {
		t, s, ok := textPart(v)
		if !ok || t != "input_text" {
			return false // images, files, parts of other APIs
		}
		parts = append(parts, part{"text", s})
		return true
	})
	if !ok {
		return nil, errors.New("content is neither a string nor input_text parts")
	}
	return json.Marshal(parts)
}

// responsesTools turns the Responses API's flat function tools into chat
// tools ({"type": "function", "function": {...}}), as construct_tool_dicts
// does: nil for no tools; tools of other types left out.
func responsesTools(raw json.RawMessage) (json.RawMessage, error) {
	if isNull(raw) || string(raw) == "[]" {
		return nil, nil
	}
	type function struct {
		Name         json.RawMessage `json:"name"`
		Description  json.RawMessage `json:"description,omitempty"`
		Parameters   json.RawMessage `json:"parameters,omitempty"`
		Strict       json.RawMessage `json:"strict,omitempty"`
		DeferLoading json.RawMessage `json:"defer_loading,omitempty"`
	}
	type tool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	tools := []tool{}
	n := 0
	var err error
	ok := jsontop.Elements(raw, func(v []byte) bool {
		var typ json.RawMessage
		var f function
		if !jsontop.Members(v, func(k, v []byte) bool {
			switch string(k) {
			case "type":
				typ = v
			case "name":
				f.Name = v
			case "description":
				f.Description = v
			case "parameters":
				f.Parameters = v
			case "strict":
				f.Strict = v
			case "defer_loading":
				f.DeferLoading = v
			}
			return true
		}) {
			err = fmt.Errorf("%w: tools[%d]: not an object", ErrNotRendered, n)
			return false
		}
		t, ok := jsonString(typ)
		switch {
		case !ok:
			err = fmt.Errorf("%w: tools[%d]: no type", ErrNotRendered, n)
			return false
		case t == "namespace":
			err = fmt.Errorf("%w: tools[%d]: a namespace of tools", ErrNotRendered, n)
			return false
		case t == "function":
			if _, ok := jsonString(f.Name); !ok {
				err = fmt.Errorf("%w: tools[%d]: a function without a string name", ErrNotRendered, n)
				return false
			}
			for _, v := range []*json.RawMessage{&f.Description, &f.Parameters, &f.Strict, &f.DeferLoading} {
				if len(*v) > 0 && !json.Valid(*v) {
					err = fmt.Errorf("%w: tools[%d]: not JSON", ErrNotRendered, n)
					return false
				}
				if isNull(*v) {
					*v = nil // unset: the serializers leave it out
				}
			}
			tools = append(tools, tool{"function", f})
		}
		n++
		return true
	})
	if !ok {
		if err == nil {
			err = fmt.Errorf("%w: tools is not a list", ErrNotRendered)
		}
		return nil, err
	}
	if len(tools) == 0 {
		return nil, fmt.Errorf("%w: tools without a function", ErrNotRendered)
	}
	return json.Marshal(tools)
}

// jsonString reads a JSON string.
func jsonString(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// mustString is s as a JSON string.
func mustString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
