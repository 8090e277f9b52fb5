package openai

import (
	"bytes"
	"strconv"
)

// Bounds of what a UsageReader keeps.
const (
	// MaxSSELine bounds one server-sent-events line: a longer line is
	// dropped unread here, and the proxy ends a stream that sends one with
	// the SSE error event. 64 KiB is far above any vLLM chunk (a chunk
	// with 20 top logprobs is a few KiB) and keeps the per-stream memory
	// budget.
	MaxSSELine = 64 << 10
	// MaxJSONBody bounds the copy of a non-streamed answer kept to read
	// its usage; the usage of a larger one is not read.
	MaxJSONBody = 4 << 20
)

// DoneEvent is the event that ends a completions stream.
const DoneEvent = "data: [DONE]\n\n"

var (
	dataPrefix   = []byte("data:")
	doneData     = []byte("[DONE]")
	usageKey     = []byte(`"usage"`)
	nullUsage    = []byte(`"usage":null`)
	optionsKey   = []byte(`"stream_options"`)
	usageOption  = []byte(`"stream_options":{"include_usage":true},`)
	eventPayload = []byte("data: ")
)

// AppendEvent appends the SSE event carrying data (one data line and the
// blank line that ends the event) to dst.
func AppendEvent(dst, data []byte) []byte {
	dst = append(dst, eventPayload...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}

// EndsWithDone reports whether a stream whose last bytes are tail ends
// with the data line "[DONE]" (whitespace around it allowed). tail needs
// to hold only the stream's last few dozen bytes.
func EndsWithDone(tail []byte) bool {
	tail = bytes.TrimRight(tail, " \t\r\n")
	rest, ok := bytes.CutSuffix(tail, doneData)
	if !ok {
		return false
	}
	rest = bytes.TrimRight(rest, " ")
	return bytes.HasSuffix(rest, dataPrefix)
}

// AskUsage makes a streamed completion report its token usage: it adds
// "stream_options":{"include_usage":true} to a body that does not mention
// stream_options at all, so the replica ends the stream with a usage-only
// chunk. body must already have parsed as a JSON object; the key is added
// first, and since no "stream_options" occurs anywhere in the body it
// cannot repeat one. asked is false, and body returned as it is, when the
// body mentions stream_options or is an empty object (nothing to put a
// comma before).
func AskUsage(body []byte) (out []byte, asked bool) {
	if bytes.Contains(body, optionsKey) {
		return body, false
	}
	open := bytes.IndexByte(body, '{')
	if open < 0 || len(bytes.TrimSpace(body[:open])) > 0 {
		return body, false
	}
	rest := bytes.TrimLeft(body[open+1:], " \t\r\n")
	if len(rest) == 0 || rest[0] == '}' {
		return body, false
	}
	out = make([]byte, 0, len(body)+len(usageOption))
	out = append(out, body[:open+1]...)
	out = append(out, usageOption...)
	out = append(out, body[open+1:]...)
	return out, true
}

// UsageReader reads a relayed answer for its model, its token usage and,
// in a stream, its first generated token: the data lines of an event
// stream (Stream, or Line for lines already split) or a JSON body (Body,
// then Finish). It reads a copy: nothing it does changes the answer. Its
// zero value is ready to use for one answer.
type UsageReader struct {
	// Model is the first model named by a chunk, or the JSON answer's.
	Model string
	// Usage is the last usage reported.
	Usage TokenCounts
	// Token is set once a stream's chunk carried a generated token (a
	// role-only first chunk does not).
	Token bool

	line    []byte
	body    bytes.Buffer
	tooLong bool
	// comp is Finish's decode target: a local would escape to the heap
	// (decodeTop takes its targets as interfaces).
	comp completion
}

// Stream reads a piece of an event stream: lines split across pieces are
// joined (up to MaxSSELine) and each is read as by Line.
func (r *UsageReader) Stream(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(r.line)+len(p) <= MaxSSELine {
				r.line = append(r.line, p...)
			} else {
				r.line = r.line[:0]
			}
			return
		}
		if len(r.line) > 0 {
			r.line = append(r.line, p[:i]...)
			r.Line(r.line)
			r.line = r.line[:0]
		} else {
			r.Line(p[:i])
		}
		p = p[i+1:]
	}
}

// Line reads one line of an event stream, without its '\n'. Before the
// first token every data line is decoded; after it, only one that carries
// a usage. It reports whether the line is the data line of a usage-only
// chunk (a usage and no choices), which a stream ends with when asked
// for stream_options.include_usage.
func (r *UsageReader) Line(line []byte) (usageOnly bool) {
	line = bytes.TrimRight(line, "\r")
	if !bytes.HasPrefix(line, dataPrefix) {
		return false
	}
	payload := bytes.TrimSpace(line[len(dataPrefix):])
	if len(payload) == 0 || payload[0] != '{' {
		return false // "[DONE]"
	}
	if r.Token && (!bytes.Contains(payload, usageKey) || bytes.Contains(payload, nullUsage)) {
		return false
	}
	var c chunk
	if !decodeChunk(payload, &c) {
		return false
	}
	if r.Model == "" {
		r.Model = c.Model
	}
	if !r.Token {
		r.Token = c.hasToken()
	}
	if c.Usage != nil {
		r.Usage = c.Usage.counts()
	}
	return c.Usage != nil && len(c.Choices) == 0
}

// MayBeUsageOnly reports whether an event stream's line may be the data
// line of a usage-only chunk (see Line): it has a non-null "usage" member.
// A line without one is not read as that chunk by Line either once the
// first token was seen.
func MayBeUsageOnly(line []byte) bool {
	return bytes.Contains(line, usageKey) && !bytes.Contains(line, nullUsage)
}

// Body keeps a piece of a non-streamed JSON answer, up to MaxJSONBody in
// all; Finish reads it.
func (r *UsageReader) Body(p []byte) {
	if r.body.Len()+len(p) <= MaxJSONBody {
		r.body.Write(p)
	} else {
		r.tooLong = true
	}
}

// Finish reads the JSON answer that Body kept, unless it outgrew
// MaxJSONBody, and lets go of it.
func (r *UsageReader) Finish() {
	if r.tooLong || r.body.Len() == 0 {
		return
	}
	c := &r.comp
	*c = completion{}
	if decodeCompletion(r.body.Bytes(), c) {
		r.Model = c.Model
		if c.Usage != nil {
			r.Usage = c.Usage.counts()
		}
	}
	r.body = bytes.Buffer{}
}

// WithPriority returns body, a JSON object, with vLLM's request field
// "priority" set to p: appended as the object's last member, so that it wins
// over one the client sent (vLLM's JSON decoding keeps the last of a
// repeated key). body is returned as it is when it does not end in '}'.
func WithPriority(body []byte, p int) []byte {
	end := len(bytes.TrimRight(body, " \t\r\n")) - 1
	if end < 1 || body[end] != '}' {
		return body
	}
	open := bytes.IndexByte(body, '{')
	if open < 0 || open >= end {
		return body
	}
	member := `"priority":` + strconv.Itoa(p)
	out := make([]byte, 0, len(body)+len(member)+1)
	out = append(out, body[:end]...)
	if len(bytes.TrimSpace(body[open+1:end])) > 0 {
		out = append(out, ',')
	}
	out = append(out, member...)
	return append(out, body[end:]...)
}
