package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/llmlb/llmlb/internal/admin"
	"github.com/llmlb/llmlb/internal/jsontop"
	"github.com/llmlb/llmlb/internal/proxy"
)

// HeaderRequestID carries the request id: taken from the client when it
// sends a sane one, generated otherwise, passed to the replica and returned
// to the client.
const HeaderRequestID = "X-Request-Id"

// observed wraps the proxy handler: it gives every request an id, watches
// the response for its first generated token and its usage, and then
// records the client-facing latency and token metrics and one access log
// line. The W3C traceparent header is passed to the replica untouched (the
// reverse proxy forwards it); its trace id is logged.
type observed struct {
	next      http.Handler
	metrics   *admin.Metrics
	log       *slog.Logger
	now       func() time.Time
	accessLog bool
}

// maxJSONBody bounds the copy of a non-streamed response kept to read its
// usage; a larger body is relayed but its usage is not counted.
const maxJSONBody = 4 << 20

// maxSSELine bounds one buffered server-sent-events line.
const maxSSELine = 1 << 20

func (o *observed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := o.now()
	id := r.Header.Get(HeaderRequestID)
	if !saneID(id) {
		id = newRequestID()
		r.Header.Set(HeaderRequestID, id)
	}
	w.Header().Set(HeaderRequestID, id)
	var tr proxy.Trace
	r = r.WithContext(proxy.WithTrace(r.Context(), &tr))
	ow := &observingWriter{ResponseWriter: w, now: o.now, trace: &tr}
	o.next.ServeHTTP(ow, r)
	end := o.now()
	ow.finish()

	ttft := time.Duration(-1)
	if !ow.ttftAt.IsZero() {
		ttft = ow.ttftAt.Sub(start)
	}
	model := tr.Model
	if model == "" {
		model = ow.model
	}
	relayed := tr.Replica != "" && ow.status < 300 && ow.status >= 200
	if relayed {
		o.metrics.Completion(model, tr.Reason, ttft, end.Sub(start), ow.usage)
	}
	if !o.accessLog {
		return
	}
	attrs := []slog.Attr{
		slog.String("request_id", id),
		slog.String("client", clientHost(r.RemoteAddr)),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", ow.status),
		slog.Duration("duration", end.Sub(start)),
		slog.Int64("bytes", ow.bytes),
	}
	if model != "" {
		attrs = append(attrs, slog.String("model", model))
	}
	if tr.Replica != "" {
		attrs = append(attrs, slog.String("replica", tr.Replica), slog.String("route", string(tr.Reason)), slog.Int("attempts", tr.Attempts))
	}
	if ttft >= 0 {
		attrs = append(attrs, slog.Duration("ttft", ttft))
	}
	if u := ow.usage; u != (admin.Usage{}) {
		attrs = append(attrs, slog.Int64("prompt_tokens", u.PromptTokens), slog.Int64("cached_tokens", u.CachedTokens),
			slog.Int64("completion_tokens", u.CompletionTokens))
	}
	if tid := traceID(r.Header.Get("Traceparent")); tid != "" {
		attrs = append(attrs, slog.String("trace_id", tid))
	}
	o.log.LogAttrs(context.Background(), slog.LevelInfo, "access", attrs...)
}

// saneID accepts a client's request id of 1-128 visible ASCII characters.
func saneID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// newRequestID is 16 random bytes in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// traceID returns the trace id of a W3C traceparent
// ("00-<32 hex>-<16 hex>-<2 hex>"), or "" when it is malformed.
func traceID(tp string) string {
	parts := strings.Split(tp, "-")
	if len(parts) < 4 || len(parts[0]) != 2 || len(parts[1]) != 32 || len(parts[2]) != 16 {
		return ""
	}
	if _, err := hex.DecodeString(parts[1]); err != nil || parts[1] == strings.Repeat("0", 32) {
		return ""
	}
	return parts[1]
}

func clientHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// observingWriter relays the response and reads it on the way: the status,
// the moment of the first generated token of a stream, the model and the
// usage (from the stream's chunks or the JSON body).
type observingWriter struct {
	http.ResponseWriter
	now   func() time.Time
	trace *proxy.Trace // UsageAsked: hold lines back and drop the usage chunk

	status  int
	bytes   int64
	kind    int // 0 unknown, 1 event stream, 2 JSON, 3 other
	line    []byte
	body    bytes.Buffer
	ttftAt  time.Time
	model   string
	usage   admin.Usage
	tooLong bool
}

const (
	kindUnknown = iota
	kindStream
	kindJSON
	kindOther
)

func (w *observingWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.classify()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *observingWriter) classify() {
	ct := w.Header().Get("Content-Type")
	switch {
	case w.status < 200 || w.status >= 300:
		w.kind = kindOther
	case strings.HasPrefix(ct, "text/event-stream"):
		w.kind = kindStream
	case strings.HasPrefix(ct, "application/json"):
		w.kind = kindJSON
	default:
		w.kind = kindOther
	}
}

func (w *observingWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
		w.classify()
	}
	if w.kind == kindStream && w.trace != nil && w.trace.UsageAsked {
		return w.writeStripped(p)
	}
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	switch w.kind {
	case kindStream:
		w.scan(p[:n])
	case kindJSON:
		if w.body.Len()+n <= maxJSONBody {
			w.body.Write(p[:n])
		} else {
			w.tooLong = true
		}
	}
	return n, err
}

// writeStripped relays a stream whose usage chunk the client did not ask
// for: whole lines only (a partial line waits for its end), minus the
// data line of the usage-only chunk. It reports p as written.
func (w *observingWriter) writeStripped(p []byte) (int, error) {
	w.line = append(w.line, p...)
	start := 0
	for {
		i := bytes.IndexByte(w.line[start:], '\n')
		if i < 0 {
			break
		}
		line := w.line[start : start+i+1]
		start += i + 1
		if w.dataLine(line[:len(line)-1]) {
			continue // the usage chunk: counted, not relayed
		}
		n, err := w.ResponseWriter.Write(line)
		w.bytes += int64(n)
		if err != nil {
			w.line = w.line[:0]
			return 0, err
		}
	}
	rest := copy(w.line, w.line[start:])
	w.line = w.line[:rest]
	if len(w.line) > maxSSELine { // not an event stream after all: pass it on
		n, err := w.ResponseWriter.Write(w.line)
		w.bytes += int64(n)
		w.line = w.line[:0]
		if err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// Flush implements http.Flusher (streams are flushed chunk by chunk).
func (w *observingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *observingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// scan splits the event stream into lines and reads its data lines.
func (w *observingWriter) scan(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(w.line)+len(p) <= maxSSELine {
				w.line = append(w.line, p...)
			} else {
				w.line = w.line[:0]
			}
			return
		}
		if len(w.line) > 0 {
			w.line = append(w.line, p[:i]...)
			w.dataLine(w.line)
			w.line = w.line[:0]
		} else {
			w.dataLine(p[:i])
		}
		p = p[i+1:]
	}
}

// chunk holds the fields of a completion (or stream chunk) that are read.
type chunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			Reasoning        string          `json:"reasoning"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *usage `json:"usage"`
}

// usage is a completion's (or stream chunk's) token usage.
type usage struct {
	PromptTokens        int64         `json:"prompt_tokens"`
	CompletionTokens    int64         `json:"completion_tokens"`
	PromptTokensDetails *tokenDetails `json:"prompt_tokens_details"`
}

// tokenDetails is usage's prompt_tokens_details.
type tokenDetails struct {
	CachedTokens int64 `json:"cached_tokens"`
}

// completion is what is read of a non-streamed answer: its choices, most
// of its bytes, are skipped rather than decoded (issue 14).
type completion struct {
	Model string `json:"model"`
	Usage *usage `json:"usage"`
}

// The JSON names of chunk's and completion's fields, in their order, for
// decodeTop.
var (
	chunkFields      = []string{"model", "choices", "usage"}
	completionFields = []string{"model", "usage"}
)

// decodeTop decodes the members of the JSON object body that encoding/json
// would match to names (exactly or case-insensitively) into the targets of
// the same index, in the body's order, and skips the other members without
// decoding them (issue 14: json.Unmarshal of a whole answer, nearly all of
// it choices, was 5% of the proxy's CPU). On a valid JSON body it gives
// what json.Unmarshal into a struct of those fields gives, a failure (a
// value of the wrong type) included (FuzzDecodeTop checks it). An invalid
// body fails too, unless it breaks only inside a member that is skipped.
func decodeTop(body []byte, names []string, targets ...any) bool {
	if string(bytes.Trim(body, " \t\r\n")) == "null" {
		return true // json.Unmarshal leaves the struct as it is
	}
	return jsontop.Members(body, func(key, value []byte) bool {
		for k, name := range names {
			if bytes.EqualFold(key, []byte(name)) {
				return decodeValue(value, targets[k])
			}
		}
		return true
	})
}

// decodeValue is json.Unmarshal(value, into) == nil, without its
// reflection for the usual shapes of what is read: a string without
// escapes, and a usage object of plain integers. Anything else goes to
// json.Unmarshal.
func decodeValue(value []byte, into any) bool {
	switch v := into.(type) {
	case *string:
		if s, ok := plainString(value); ok {
			*v = s
			return true
		}
	case **usage:
		if u, ok := plainUsage(value, *v); ok {
			*v = u
			return true
		}
	}
	return json.Unmarshal(value, into) == nil
}

// plainString returns the value of a JSON string literal without escapes
// or control characters, in valid UTF-8; ok is false for anything else.
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	for _, c := range in {
		if c < 0x20 || c == '"' || c == '\\' {
			return "", false
		}
	}
	if !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
}

// plainUsage decodes a usage object over prev as json.Unmarshal would
// (null clears it, members update a copy of it), when every member it
// reads is a plain integer (or prompt_tokens_details null or an object of
// them); ok is false otherwise, and prev is left untouched.
func plainUsage(raw []byte, prev *usage) (*usage, bool) {
	if string(raw) == "null" {
		return nil, true
	}
	var u usage
	if prev != nil {
		u = *prev
	}
	ok := jsontop.Members(raw, func(key, value []byte) bool {
		switch {
		case bytes.EqualFold(key, []byte("prompt_tokens")):
			return plainInt(value, &u.PromptTokens)
		case bytes.EqualFold(key, []byte("completion_tokens")):
			return plainInt(value, &u.CompletionTokens)
		case bytes.EqualFold(key, []byte("prompt_tokens_details")):
			if string(value) == "null" {
				u.PromptTokensDetails = nil
				return true
			}
			var d tokenDetails
			if u.PromptTokensDetails != nil {
				d = *u.PromptTokensDetails
			}
			u.PromptTokensDetails = &d
			return jsontop.Members(value, func(key, value []byte) bool {
				if bytes.EqualFold(key, []byte("cached_tokens")) {
					return plainInt(value, &d.CachedTokens)
				}
				return true
			})
		}
		return true
	})
	if !ok {
		return nil, false
	}
	return &u, true
}

// plainInt parses a JSON integer of at most 17 digits into n; ok is false
// for anything else (a fraction, an exponent, null, a string).
func plainInt(raw []byte, n *int64) bool {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 17 || (digits[0] == '0' && len(digits) > 1) {
		return false
	}
	var v int64
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
		v = v*10 + int64(c-'0')
	}
	if len(digits) < len(raw) {
		v = -v
	}
	*n = v
	return true
}

var (
	dataPrefix = []byte("data:")
	usageKey   = []byte(`"usage"`)
	nullUsage  = []byte(`"usage":null`)
)

// dataLine reads one SSE line. Before the first token every data line is
// decoded (the first chunk is often role-only: it is not a token); after
// it, only a chunk carrying usage is. It reports whether the line is a
// usage-only chunk (usage and no choices).
func (w *observingWriter) dataLine(line []byte) (usageOnly bool) {
	line = bytes.TrimRight(line, "\r")
	if !bytes.HasPrefix(line, dataPrefix) {
		return false
	}
	payload := bytes.TrimSpace(line[len(dataPrefix):])
	if len(payload) == 0 || payload[0] != '{' {
		return false // "[DONE]"
	}
	if !w.ttftAt.IsZero() && (!bytes.Contains(payload, usageKey) || bytes.Contains(payload, nullUsage)) {
		return false
	}
	var c chunk
	if !decodeTop(payload, chunkFields, &c.Model, &c.Choices, &c.Usage) {
		return false
	}
	if w.model == "" {
		w.model = c.Model
	}
	if w.ttftAt.IsZero() {
		for _, ch := range c.Choices {
			d := ch.Delta
			if ch.Text != "" || d.Content != "" || d.ReasoningContent != "" || d.Reasoning != "" ||
				(len(d.ToolCalls) > 0 && string(d.ToolCalls) != "null" && string(d.ToolCalls) != "[]") {
				w.ttftAt = w.now()
				break
			}
		}
	}
	w.setUsage(c.Usage)
	return c.Usage != nil && len(c.Choices) == 0
}

func (w *observingWriter) setUsage(u *usage) {
	if u == nil {
		return
	}
	w.usage = admin.Usage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
	if d := u.PromptTokensDetails; d != nil {
		w.usage.CachedTokens = d.CachedTokens
	}
}

// finish relays what a stripped stream still holds (a last line without
// its newline) and reads the usage of a non-streamed JSON response.
func (w *observingWriter) finish() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if w.kind == kindStream && w.trace != nil && w.trace.UsageAsked && len(w.line) > 0 {
		n, _ := w.ResponseWriter.Write(w.line)
		w.bytes += int64(n)
		w.line = w.line[:0]
	}
	if w.kind != kindJSON || w.tooLong || w.body.Len() == 0 {
		return
	}
	var c completion
	if decodeTop(w.body.Bytes(), completionFields, &c.Model, &c.Usage) {
		w.model = c.Model
		w.setUsage(c.Usage)
	}
	w.body = bytes.Buffer{}
}
