package simreplica

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// Version is what GET /version reports: vLLM's shape, marked as simulated.
const Version = "0.12.0-sim"

// legacyVersion is reported with LegacyMetrics (the pre-0.12 metric names).
const legacyVersion = "0.11.0-sim"

// handler is the main listener's mux: the vLLM surface behind the fault
// gate, and the control endpoint beside it.
func (r *Replica) handler() http.Handler {
	api := http.NewServeMux()
	api.HandleFunc("POST /v1/chat/completions", r.handleChat)
	api.HandleFunc("POST /v1/completions", r.handleCompletions)
	api.HandleFunc("POST /v1/messages", r.handleMessages)   // agentapi.go
	api.HandleFunc("POST /v1/responses", r.handleResponses) // agentapi.go
	api.HandleFunc("POST /v1/embeddings", r.handleEmbeddings)
	api.HandleFunc("GET /v1/models", r.handleModels)
	api.HandleFunc("GET /health", r.handleHealth)
	api.HandleFunc("GET /version", r.handleVersion)
	api.Handle("GET /metrics", r.metrics)

	mux := http.NewServeMux()
	mux.Handle("/", r.faultGate(api))
	mux.Handle("/sim/", r.controlHandler())
	return mux
}

// controlHandler serves GET and POST /sim/fault.
func (r *Replica) controlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /sim/fault", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, r.Fault())
	})
	mux.HandleFunc("POST /sim/fault", func(w http.ResponseWriter, req *http.Request) {
		var f Fault
		body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, 1<<16))
		if err == nil {
			err = json.Unmarshal(body, &f)
		}
		if err == nil {
			err = r.SetFault(f)
		}
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, r.Fault())
	})
	return mux
}

// faultGate applies the hang and error faults to every vLLM endpoint.
// /health answers 503 whenever the error fault is on, whatever its rate.
func (r *Replica) faultGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch r.Fault().Mode {
		case Hang:
			// Accept, never answer: hold the request until the client gives up
			// or the replica stops.
			select {
			case <-req.Context().Done():
			case <-r.stopped:
			}
			return
		case Error:
			status, fail := r.drawError()
			if req.URL.Path == "/health" {
				if !fail {
					status = r.Fault().Status
				}
				w.WriteHeader(status)
				return
			}
			if fail {
				writeError(w, status, "simulated fault: replica error")
				return
			}
		}
		next.ServeHTTP(w, req)
	})
}

func (r *Replica) handleHealth(w http.ResponseWriter, _ *http.Request) {
	w.WriteHeader(http.StatusOK)
}

func (r *Replica) handleVersion(w http.ResponseWriter, _ *http.Request) {
	v := Version
	if r.opts.LegacyMetrics {
		v = legacyVersion
	}
	writeJSON(w, http.StatusOK, map[string]string{"version": v})
}

func (r *Replica) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, modelList{Object: openai.ObjectList, Data: []modelCard{{
		Model: openai.Model{ID: r.model, Object: openai.ObjectModel, Created: r.created, OwnedBy: "vllm"},
		Root:  r.model, MaxModelLen: r.profile.MaxModelLen,
	}}})
}

// genRequest is a validated generation request, chat or completion.
type genRequest struct {
	chat         bool
	prompt       tokenize.Prompt
	maxTokens    int
	stop         bool // max_tokens absent: finish with "stop"
	stream       bool
	includeUsage bool
	tool         string // the function a chat request's tool_choice requires ("": none)
	toolArgs     string // its arguments, a JSON object its parameters accept
	priority     int    // vLLM's request priority (engine.Request.Priority)
}

func (r *Replica) handleChat(w http.ResponseWriter, req *http.Request) {
	var body chatRequest
	data, ok := r.decodeBody(w, req, &body)
	if !ok {
		return
	}
	if !r.checkModel(w, body.Model) || !checkN(w, body.N) {
		return
	}
	prompt, err := r.chatPrompt(body.Messages, data)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	limit := body.MaxCompletionTokens
	if limit == nil {
		limit = body.MaxTokens
	}
	g, ok := r.limitTokens(w, prompt, limit)
	if !ok {
		return
	}
	g.chat, g.stream = true, body.Stream
	if len(body.Tools) > 0 {
		g.tool = requiredTool(body.ToolChoice, body.Tools[0].Function.Name)
		for _, t := range body.Tools {
			if g.tool != "" && t.Function.Name == g.tool {
				g.toolArgs = toolArguments(t.Function.Parameters)
				break
			}
		}
		if g.toolArgs == "" {
			g.toolArgs = "{}"
		}
	}
	g.includeUsage = body.StreamOptions != nil && body.StreamOptions.IncludeUsage
	if g.priority, ok = r.checkPriority(w, body.Priority); !ok {
		return
	}
	r.generate(w, req, g)
}

// checkPriority accepts a request's priority as vLLM does: any with
// priority scheduling, only 0 without (it answers 400 otherwise).
func (r *Replica) checkPriority(w http.ResponseWriter, p int) (int, bool) {
	if p != 0 && !r.profile.PriorityScheduling {
		writeError(w, http.StatusBadRequest, "Got priority "+strconv.Itoa(p)+" but Priority scheduling is not enabled.")
		return 0, false
	}
	return p, true
}

func (r *Replica) handleCompletions(w http.ResponseWriter, req *http.Request) {
	var body completionRequest
	if !r.decode(w, req, &body) {
		return
	}
	if !r.checkModel(w, body.Model) || !checkN(w, body.N) {
		return
	}
	prompt, err := r.completionPrompt(body.Prompt)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	g, ok := r.limitTokens(w, prompt, body.MaxTokens)
	if !ok {
		return
	}
	g.stream = body.Stream
	g.includeUsage = body.StreamOptions != nil && body.StreamOptions.IncludeUsage
	if g.priority, ok = r.checkPriority(w, body.Priority); !ok {
		return
	}
	r.generate(w, req, g)
}

// decode reads a JSON body within the size limit; on failure it answers.
func (r *Replica) decode(w http.ResponseWriter, req *http.Request, v any) bool {
	_, ok := r.decodeBody(w, req, v)
	return ok
}

// decodeBody is decode that also returns the body read.
func (r *Replica) decodeBody(w http.ResponseWriter, req *http.Request, v any) ([]byte, bool) {
	data, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.opts.MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", r.opts.MaxBodyBytes))
			return nil, false
		}
		writeError(w, http.StatusBadRequest, "cannot read request body: "+err.Error())
		return nil, false
	}
	if len(bytes.TrimSpace(data)) == 0 {
		writeError(w, http.StatusBadRequest, "request body is empty; expected a JSON object")
		return nil, false
	}
	if err := json.Unmarshal(data, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return nil, false
	}
	return data, true
}

// checkModel accepts the served model, or no model at all as vLLM does.
func (r *Replica) checkModel(w http.ResponseWriter, model string) bool {
	if model == "" || model == r.model {
		return true
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("The model `%s` does not exist.", model))
	return false
}

func checkN(w http.ResponseWriter, n *int) bool {
	if n == nil || *n == 1 {
		return true
	}
	writeError(w, http.StatusBadRequest, "the simulator supports only n=1")
	return false
}

// limitTokens checks the prompt against the context and picks the output
// length: max_tokens clamped to what the context leaves, or the default.
func (r *Replica) limitTokens(w http.ResponseWriter, p tokenize.Prompt, limit *int) (genRequest, bool) {
	maxLen := r.profile.MaxModelLen
	if p.Tokens == 0 {
		writeError(w, http.StatusBadRequest, "The decoder prompt cannot be empty")
		return genRequest{}, false
	}
	if maxLen > 0 && p.Tokens >= maxLen {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
			maxLen, p.Tokens))
		return genRequest{}, false
	}
	g := genRequest{prompt: p}
	if limit != nil {
		if *limit < 1 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("max_tokens must be at least 1, got %d.", *limit))
			return genRequest{}, false
		}
		g.maxTokens = *limit
	} else {
		g.maxTokens, g.stop = r.opts.DefaultMaxTokens, true
	}
	if maxLen > 0 {
		g.maxTokens = min(g.maxTokens, maxLen-p.Tokens)
	}
	return g, true
}

// generate runs a request through the engine and writes the response.
func (r *Replica) generate(w http.ResponseWriter, req *http.Request, g genRequest) {
	id, st, err := r.submit(engine.Request{Prompt: g.prompt, MaxTokens: g.maxTokens, StreamTokens: g.stream, Priority: g.priority}, g.stop)
	if err != nil {
		status := http.StatusBadRequest
		if !errors.Is(err, engine.ErrPromptTooLong) && !errors.Is(err, engine.ErrBadRequest) {
			status = http.StatusInternalServerError
		}
		writeError(w, status, err.Error())
		return
	}
	finished := false
	defer func() {
		if !finished {
			r.cancel(id)
		}
	}()
	o := output{w: w, g: g, model: r.model, created: time.Now().Unix(), id: strconv.FormatUint(id, 10)}
	if g.chat {
		o.id = "chatcmpl-sim-" + o.id
	} else {
		o.id = "cmpl-sim-" + o.id
	}
	flusher := http.NewResponseController(w)
	for {
		select {
		case <-st.notify:
		case <-req.Context().Done():
			return
		case <-r.stopped:
			return
		}
		s := r.read(st)
		if s.aborted {
			return
		}
		if !g.stream {
			if !s.done {
				continue
			}
			if r.Fault().Mode == Break {
				panic(http.ErrAbortHandler) // cut: the connection closes, no response
			}
			finished = true
			o.writeFull(s)
			return
		}
		if (s.firstDone || s.tokens > 0) && !o.started {
			o.start()
		}
		for o.sent < s.tokens {
			if f := r.Fault(); f.Mode == Break && o.sent >= f.AfterTokens {
				flusher.Flush()
				panic(http.ErrAbortHandler) // cut mid-stream: no [DONE]
			}
			o.writeToken(o.sent == g.maxTokens-1)
		}
		if s.done {
			finished = true
			o.finish(s)
			flusher.Flush()
			return
		}
		if err := flusher.Flush(); err != nil {
			return
		}
	}
}

// output writes one response in the OpenAI shapes.
type output struct {
	w       http.ResponseWriter
	g       genRequest
	model   string
	created int64
	id      string
	started bool
	sent    int  // token chunks written
	closed  bool // the finish_reason chunk was written
}

func (o *output) finishReason() string {
	if o.g.tool != "" {
		return "tool_calls"
	}
	if o.g.stop {
		return "stop"
	}
	return "length"
}

// toolCallID is the id of the response's tool call, as vLLM spells them.
func (o *output) toolCallID() string { return "chatcmpl-tool-" + o.id }

func (o *output) object() string {
	if o.g.chat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

// start sends the SSE headers and, for chat, the role chunk. Like vLLM, the
// response begins only when the first token exists, so time to first byte is
// the time to first token.
func (o *output) start() {
	o.started = true
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	o.w.WriteHeader(http.StatusOK)
	if o.g.chat {
		empty := ""
		o.event(chunk{Choices: []chunkChoice{{Delta: &delta{Role: "assistant", Content: &empty}}}})
	}
}

func (o *output) writeToken(last bool) {
	text := tokenText(o.sent)
	c := chunkChoice{}
	switch {
	case o.g.tool != "":
		// The whole call in the first delta, then empty ones while the
		// engine produces the call's tokens.
		c.Delta = &delta{}
		if o.sent == 0 {
			zero := 0
			c.Delta.ToolCalls = []toolCall{{Index: &zero, ID: o.toolCallID(), Type: "function", Function: toolFunction{Name: o.g.tool, Arguments: o.g.toolArgs}}}
		}
	case o.g.chat:
		c.Delta = &delta{Content: &text}
	default:
		c.Text = &text
	}
	if last {
		reason := o.finishReason()
		c.FinishReason = &reason
		o.closed = true
	}
	o.sent++
	o.event(chunk{Choices: []chunkChoice{c}})
}

// finish ends the stream: a finish_reason chunk if none was sent, the usage
// chunk if asked for, and [DONE].
func (o *output) finish(s reqState) {
	if !o.started {
		o.start()
	}
	if !o.closed {
		reason := o.finishReason()
		c := chunkChoice{FinishReason: &reason}
		empty := ""
		if o.g.chat {
			c.Delta = &delta{Content: &empty}
		} else {
			c.Text = &empty
		}
		o.event(chunk{Choices: []chunkChoice{c}})
	}
	if o.g.includeUsage {
		o.event(chunk{Choices: []chunkChoice{}, Usage: openai.NewUsage(o.g.prompt.Tokens, o.sent, s.cached)})
	}
	io.WriteString(o.w, openai.DoneEvent)
}

func (o *output) event(c chunk) {
	c.ID, c.Object, c.Created, c.Model = o.id, o.object(), o.created, o.model
	b, err := json.Marshal(c)
	if err != nil {
		return
	}
	o.w.Write(openai.AppendEvent(make([]byte, 0, len(b)+8), b))
}

// writeFull writes a non-streamed "chat.completion" or "text_completion".
func (o *output) writeFull(s reqState) {
	n := o.g.maxTokens
	text := outputText(n)
	c := choice{FinishReason: o.finishReason()}
	object := "text_completion"
	if o.g.chat {
		object = "chat.completion"
		c.Message = &message{Role: "assistant", Content: &text, ToolCalls: []toolCall{}}
		if o.g.tool != "" {
			c.Message.Content = nil
			c.Message.ToolCalls = []toolCall{{ID: o.toolCallID(), Type: "function", Function: toolFunction{Name: o.g.tool, Arguments: o.g.toolArgs}}}
		}
	} else {
		c.Text = &text
	}
	writeJSON(o.w, http.StatusOK, completion{
		ID: o.id, Object: object, Created: o.created, Model: o.model,
		Choices: []choice{c}, Usage: openai.NewUsage(o.g.prompt.Tokens, n, s.cached),
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, `{"error":{"message":"simreplica: encoding failed","type":"InternalServerError","param":null,"code":500}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeError answers in vLLM's error shape.
func writeError(w http.ResponseWriter, status int, msg string) {
	msg = strings.TrimPrefix(msg, "simreplica: ")
	writeJSON(w, status, openai.NewReplicaError(status, msg))
}

// chatPrompt reads a chat request's prompt (its messages, and its body
// for the tools and tool calls): with the model's tokenizer when the
// replica has one, else with the pseudo-tokenizer.
func (r *Replica) chatPrompt(msgs []chatMessage, body []byte) (tokenize.Prompt, error) {
	if r.toks != nil {
		return r.toks.chat(msgs, body)
	}
	return chatPrompt(msgs)
}

// completionPrompt reads a completions prompt as chatPrompt does.
func (r *Replica) completionPrompt(raw json.RawMessage) (tokenize.Prompt, error) {
	if r.toks != nil && len(raw) > 0 && string(raw) != "null" {
		return r.toks.completion(raw)
	}
	return completionPrompt(raw)
}
