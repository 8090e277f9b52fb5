package simreplica

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// The agents' APIs as vLLM serves them beside the OpenAI chat API: the
// Anthropic Messages API (POST /v1/messages), the OpenAI Responses API
// (POST /v1/responses) and embeddings (POST /v1/embeddings). They run on
// the same engine as chat, so their prompts share the prefix cache and
// their load shows in /metrics. A request that requires a tool (Anthropic
// tool_choice any or tool, Responses tool_choice required or a named
// function) is answered with a call of it (the named one, else the first)
// whose arguments fill the tool's required parameters with placeholders
// (toolArguments), as a model forced to call a tool does.

// drive runs g through the engine. While streaming it calls progress with
// each newer state; it returns the final state, or false when the request
// ended otherwise (client gone, replica stopped, error answered).
func (r *Replica) drive(w http.ResponseWriter, req *http.Request, g genRequest, progress func(s reqState) error) (reqState, bool) {
	id, st, err := r.submit(engine.Request{Prompt: g.prompt, MaxTokens: g.maxTokens, StreamTokens: g.stream}, g.stop)
	if err != nil {
		status := http.StatusBadRequest
		if !errors.Is(err, engine.ErrPromptTooLong) && !errors.Is(err, engine.ErrBadRequest) {
			status = http.StatusInternalServerError
		}
		writeError(w, status, err.Error())
		return reqState{}, false
	}
	finished := false
	defer func() {
		if !finished {
			r.cancel(id)
		}
	}()
	for {
		select {
		case <-st.notify:
		case <-req.Context().Done():
			return reqState{}, false
		case <-r.stopped:
			return reqState{}, false
		}
		s := r.read(st)
		if s.aborted {
			return reqState{}, false
		}
		if f := r.Fault(); f.Mode == Break && (!g.stream && s.done || g.stream && s.tokens > f.AfterTokens) {
			panic(http.ErrAbortHandler) // cut: no complete response
		}
		if g.stream && (s.firstDone || s.tokens > 0) {
			if err := progress(s); err != nil {
				return reqState{}, false
			}
		}
		if s.done {
			finished = true
			return s, true
		}
	}
}

// sse writes one server-sent event with an event name, as both the
// Anthropic and the Responses streams name theirs, and flushes it.
type sse struct {
	w       http.ResponseWriter
	started bool
}

func (e *sse) send(event string, v any) error {
	if !e.started {
		e.started = true
		h := e.w.Header()
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		e.w.WriteHeader(http.StatusOK)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b); err != nil {
		return err
	}
	return http.NewResponseController(e.w).Flush()
}

// textOf reads a content field that is a string or an array of blocks with
// text (Anthropic's text blocks, the Responses API's input_text parts);
// other blocks (images, tool results without text) count as nothing.
func textOf(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var blocks []struct {
		Text    string          `json:"text"`
		Content json.RawMessage `json:"content"` // tool_result blocks
		Output  json.RawMessage `json:"output"`  // function_call_output items
	}
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return "", errors.New("content must be a string or an array of content blocks")
	}
	var b strings.Builder
	for _, bl := range blocks {
		b.WriteString(bl.Text)
		for _, inner := range []json.RawMessage{bl.Content, bl.Output} {
			if t, err := textOf(inner); err == nil {
				b.WriteString(t)
			}
		}
	}
	return b.String(), nil
}

// --- Anthropic Messages API ---

type anthropicRequest struct {
	Model     string             `json:"model"`
	System    json.RawMessage    `json:"system"`
	Messages  []anthropicMessage `json:"messages"`
	MaxTokens *int               `json:"max_tokens"`
	Stream    bool               `json:"stream"`
	Tools     []struct {
		Name        string          `json:"name"`
		InputSchema json.RawMessage `json:"input_schema"`
	} `json:"tools"`
	ToolChoice *struct {
		Type string `json:"type"` // auto | any | tool | none
		Name string `json:"name"`
	} `json:"tool_choice"`
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// anthropicUsage is the Messages API's usage; cache reads are the
// prompt tokens found in the prefix cache.
type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

func (r *Replica) handleMessages(w http.ResponseWriter, req *http.Request) {
	var body anthropicRequest
	raw, ok := r.decodeBody(w, req, &body)
	if !ok || !r.checkModel(w, body.Model) {
		return
	}
	if body.MaxTokens == nil {
		writeError(w, http.StatusBadRequest, "max_tokens is required")
		return
	}
	if len(body.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "messages must be a non-empty array")
		return
	}
	var tm []tokenize.Message
	if sys, err := textOf(body.System); err != nil {
		writeError(w, http.StatusBadRequest, "system: "+err.Error())
		return
	} else if sys != "" {
		tm = append(tm, tokenize.Message{Role: "system", Content: sys})
	}
	for i, m := range body.Messages {
		text, err := textOf(m.Content)
		if err != nil || m.Role == "" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("messages[%d]: a role and a string or block content are required", i))
			return
		}
		tm = append(tm, tokenize.Message{Role: m.Role, Content: text})
	}
	prompt := tokenize.FromText(tokenize.RenderChat(tm))
	if r.toks != nil {
		var err error
		if prompt, err = r.toks.messages(tm, raw); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	g, ok := r.limitTokens(w, prompt, body.MaxTokens)
	if !ok {
		return
	}
	g.stream = body.Stream
	tool := ""
	if tc := body.ToolChoice; tc != nil && len(body.Tools) > 0 {
		switch tc.Type {
		case "tool":
			tool = tc.Name
		case "any":
			tool = body.Tools[0].Name
		}
	}
	args := "{}"
	for _, t := range body.Tools {
		if tool != "" && t.Name == tool {
			args = toolArguments(t.InputSchema)
			break
		}
	}
	id := "msg_sim" + strconv.FormatUint(r.nextID.Load()+1, 10)
	toolID := "toolu_sim" + strconv.FormatUint(r.nextID.Load()+1, 10)
	stopReason := func(s reqState) string {
		switch {
		case tool != "":
			return "tool_use"
		case s.stop:
			return "end_turn"
		}
		return "max_tokens"
	}
	usage := func(s reqState) anthropicUsage {
		return anthropicUsage{InputTokens: g.prompt.Tokens - s.cached, OutputTokens: s.tokens, CacheReadInputTokens: s.cached}
	}
	if !g.stream {
		s, ok := r.drive(w, req, g, nil)
		if !ok {
			return
		}
		content := []map[string]any{{"type": "text", "text": outputText(s.tokens)}}
		if tool != "" {
			content = []map[string]any{{"type": "tool_use", "id": toolID, "name": tool, "input": json.RawMessage(args)}}
		}
		writeJSON(w, http.StatusOK, map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": r.model, "content": content,
			"stop_reason": stopReason(s), "stop_sequence": nil, "usage": usage(s),
		})
		return
	}
	e := &sse{w: w}
	sent := 0
	start := func(s reqState) error {
		if err := e.send("message_start", map[string]any{"type": "message_start", "message": map[string]any{
			"id": id, "type": "message", "role": "assistant", "model": r.model, "content": []any{},
			"stop_reason": nil, "stop_sequence": nil, "usage": anthropicUsage{InputTokens: g.prompt.Tokens - s.cached, CacheReadInputTokens: s.cached},
		}}); err != nil {
			return err
		}
		block := map[string]any{"type": "text", "text": ""}
		if tool != "" {
			block = map[string]any{"type": "tool_use", "id": toolID, "name": tool, "input": map[string]any{}}
		}
		return e.send("content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": block})
	}
	s, ok := r.drive(w, req, g, func(s reqState) error {
		if !e.started {
			if err := start(s); err != nil {
				return err
			}
		}
		for ; sent < s.tokens; sent++ {
			d := map[string]any{"type": "text_delta", "text": tokenText(sent)}
			if tool != "" {
				if sent > 0 {
					continue
				}
				d = map[string]any{"type": "input_json_delta", "partial_json": args}
			}
			if err := e.send("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": d}); err != nil {
				return err
			}
		}
		return nil
	})
	if !ok {
		return
	}
	if !e.started && start(s) != nil {
		return
	}
	_ = e.send("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
	_ = e.send("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]any{"stop_reason": stopReason(s), "stop_sequence": nil}, "usage": map[string]int{"output_tokens": s.tokens}})
	_ = e.send("message_stop", map[string]any{"type": "message_stop"})
}

// --- OpenAI Responses API ---

type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    string          `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
	Tools           []struct {
		Type       string          `json:"type"`
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	} `json:"tools"`
	ToolChoice json.RawMessage `json:"tool_choice"` // "auto" | "required" | "none" | {"type":"function","name":...}
}

// responsesMessages reads instructions and input (a string or a list of
// items: messages and tool outputs) as the roles and texts of a chat.
func responsesMessages(body *responsesRequest) ([]tokenize.Message, error) {
	var tm []tokenize.Message
	if body.Instructions != "" {
		tm = append(tm, tokenize.Message{Role: "system", Content: body.Instructions})
	}
	var s string
	if err := json.Unmarshal(body.Input, &s); err == nil {
		tm = append(tm, tokenize.Message{Role: "user", Content: s})
	} else {
		var items []struct {
			Type    string          `json:"type"`
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
			Output  json.RawMessage `json:"output"`
		}
		if err := json.Unmarshal(body.Input, &items); err != nil {
			return nil, errors.New("input must be a string or an array of input items")
		}
		for i, it := range items {
			raw, role := it.Content, it.Role
			if it.Type == "function_call_output" {
				raw, role = it.Output, "tool"
			}
			text, err := textOf(raw)
			if err != nil {
				return nil, fmt.Errorf("input[%d]: %w", i, err)
			}
			if role == "" {
				role = "user"
			}
			tm = append(tm, tokenize.Message{Role: role, Content: text})
		}
	}
	if len(tm) == 0 {
		return nil, errors.New("input is required")
	}
	return tm, nil
}

// requiredTool is the function a Responses or chat tool_choice requires
// ("" if none): the named one, or the first tool for "required".
func requiredTool(choice json.RawMessage, first string) string {
	var s string
	if err := json.Unmarshal(choice, &s); err == nil {
		if s == "required" {
			return first
		}
		return ""
	}
	var named struct {
		Type     string `json:"type"`
		Name     string `json:"name"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if json.Unmarshal(choice, &named) == nil && named.Type == "function" {
		if named.Name != "" {
			return named.Name
		}
		return named.Function.Name
	}
	return ""
}

func (r *Replica) handleResponses(w http.ResponseWriter, req *http.Request) {
	var body responsesRequest
	raw, ok := r.decodeBody(w, req, &body)
	if !ok || !r.checkModel(w, body.Model) {
		return
	}
	tm, err := responsesMessages(&body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	// With the model's tokenizer the request is rendered as vLLM's
	// /v1/responses renders it, turned into a chat.
	prompt := tokenize.FromText(tokenize.RenderChat(tm))
	if r.toks != nil {
		if prompt, err = r.toks.responses(tm, raw); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	}
	g, ok := r.limitTokens(w, prompt, body.MaxOutputTokens)
	if !ok {
		return
	}
	g.stream = body.Stream
	tool := ""
	if len(body.Tools) > 0 {
		tool = requiredTool(body.ToolChoice, body.Tools[0].Name)
	}
	toolArgs := "{}"
	for _, t := range body.Tools {
		if tool != "" && t.Name == tool {
			toolArgs = toolArguments(t.Parameters)
			break
		}
	}
	n := strconv.FormatUint(r.nextID.Load()+1, 10)
	id, itemID, created := "resp_sim"+n, "msg_sim"+n, time.Now().Unix()
	item := func(s reqState, status string) map[string]any {
		if tool != "" {
			args := ""
			if status == "completed" {
				args = toolArgs
			}
			return map[string]any{"type": "function_call", "id": "fc_sim" + n, "call_id": "call_sim" + n,
				"name": tool, "arguments": args, "status": status}
		}
		content := []any{}
		if status == "completed" {
			content = append(content, map[string]any{"type": "output_text", "text": outputText(s.tokens), "annotations": []any{}})
		}
		return map[string]any{"type": "message", "id": itemID, "status": status, "role": "assistant", "content": content}
	}
	response := func(s reqState, status string) map[string]any {
		resp := map[string]any{"id": id, "object": "response", "created_at": created, "status": status, "model": r.model,
			"output": []any{}, "incomplete_details": nil, "error": nil}
		if status != "in_progress" {
			resp["output"] = []any{item(s, "completed")}
			resp["usage"] = map[string]any{"input_tokens": g.prompt.Tokens, "output_tokens": s.tokens,
				"total_tokens":         g.prompt.Tokens + s.tokens,
				"input_tokens_details": map[string]int{"cached_tokens": s.cached}, "output_tokens_details": map[string]int{"reasoning_tokens": 0}}
			if status == "incomplete" {
				resp["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
			}
		}
		return resp
	}
	final := func(s reqState) string {
		if s.stop || tool != "" {
			return "completed"
		}
		return "incomplete"
	}
	if !g.stream {
		s, ok := r.drive(w, req, g, nil)
		if ok {
			writeJSON(w, http.StatusOK, response(s, final(s)))
		}
		return
	}
	e := &sse{w: w}
	seq, sent := 0, 0
	send := func(event string, v map[string]any) error {
		v["type"], v["sequence_number"] = event, seq
		seq++
		return e.send(event, v)
	}
	start := func(s reqState) error {
		if err := send("response.created", map[string]any{"response": response(s, "in_progress")}); err != nil {
			return err
		}
		if err := send("response.output_item.added", map[string]any{"output_index": 0, "item": item(s, "in_progress")}); err != nil {
			return err
		}
		if tool != "" {
			return nil
		}
		return send("response.content_part.added", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
	}
	s, ok := r.drive(w, req, g, func(s reqState) error {
		if !e.started {
			if err := start(s); err != nil {
				return err
			}
		}
		for ; sent < s.tokens; sent++ {
			var err error
			if tool == "" {
				err = send("response.output_text.delta", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "delta": tokenText(sent)})
			} else if sent == 0 {
				err = send("response.function_call_arguments.delta", map[string]any{"item_id": "fc_sim" + n, "output_index": 0, "delta": toolArgs})
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if !ok || (!e.started && start(s) != nil) {
		return
	}
	if tool == "" {
		text := outputText(s.tokens)
		_ = send("response.output_text.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0, "text": text})
		_ = send("response.content_part.done", map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0,
			"part": map[string]any{"type": "output_text", "text": text, "annotations": []any{}}})
	} else {
		_ = send("response.function_call_arguments.done", map[string]any{"item_id": "fc_sim" + n, "output_index": 0, "arguments": toolArgs})
	}
	_ = send("response.output_item.done", map[string]any{"output_index": 0, "item": item(s, "completed")})
	status := final(s)
	_ = send("response."+status, map[string]any{"response": response(s, status)})
}

// --- Embeddings ---

type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
}

// embeddingDims is the simulated embedding's length without dimensions.
const embeddingDims = 16

func (r *Replica) handleEmbeddings(w http.ResponseWriter, req *http.Request) {
	var body embeddingsRequest
	if !r.decode(w, req, &body) || !r.checkModel(w, body.Model) {
		return
	}
	if body.EncodingFormat != "" && body.EncodingFormat != "float" {
		writeError(w, http.StatusBadRequest, "the simulator supports encoding_format float only")
		return
	}
	dims := embeddingDims
	if body.Dimensions != nil {
		if *body.Dimensions < 1 || *body.Dimensions > 4096 {
			writeError(w, http.StatusBadRequest, "dimensions must be between 1 and 4096")
			return
		}
		dims = *body.Dimensions
	}
	var inputs []tokenize.Prompt
	var one string
	var many []string
	switch {
	case json.Unmarshal(body.Input, &one) == nil:
		inputs = append(inputs, tokenize.FromText(one))
	case json.Unmarshal(body.Input, &many) == nil && len(many) > 0:
		for _, s := range many {
			inputs = append(inputs, tokenize.FromText(s))
		}
	default:
		p, err := completionPrompt(body.Input) // token ids
		if err != nil {
			writeError(w, http.StatusBadRequest, "input must be a string, an array of strings or an array of token ids")
			return
		}
		inputs = append(inputs, p)
	}
	data := make([]map[string]any, len(inputs))
	total := 0
	for i, p := range inputs {
		// The input's prefill runs on the engine like a prompt's (one
		// output token stands for the pooling step).
		one := 1
		g, ok := r.limitTokens(w, p, &one)
		if !ok {
			return
		}
		if _, ok := r.drive(w, req, g, nil); !ok {
			return
		}
		total += p.Tokens
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": embed(p, dims)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data, "model": r.model,
		"usage": map[string]int{"prompt_tokens": total, "total_tokens": total}})
}

// embed is a deterministic unit vector of the prompt's blocks: equal
// inputs embed equally.
func embed(p tokenize.Prompt, dims int) []float64 {
	v := make([]float64, dims)
	seed := uint64(p.Tokens) + 1
	for _, b := range p.Blocks {
		seed = seed*1099511628211 ^ b
	}
	var norm float64
	for i := range v {
		seed ^= seed << 13
		seed ^= seed >> 7
		seed ^= seed << 17
		v[i] = float64(int64(seed%2001)-1000) / 1000
		norm += v[i] * v[i]
	}
	norm = math.Sqrt(norm)
	for i := range v {
		if norm > 0 {
			v[i] /= norm
		}
	}
	return v
}
