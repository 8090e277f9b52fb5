package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/admin"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
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
	bal       *balancer.Balancer // told the cached tokens the engine reported (nil: not told)
	log       *slog.Logger
	now       func() time.Time
	accessLog bool
}

func (o *observed) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := o.now()
	ow := o.begin(w, r)
	o.next.ServeHTTP(ow, r)
	o.record(ow, r, start)
}

// begin returns the writer that observes the response, and gives the
// request its id.
func (o *observed) begin(w http.ResponseWriter, r *http.Request) *observingWriter {
	// The writer carries the Trace (proxy.TracedWriter): no copy of the
	// request for a context that would carry it.
	ow := &observingWriter{ResponseWriter: w, now: o.now}
	ow.flusher, _ = w.(http.Flusher)
	ow.trace = &ow.tr
	id := r.Header.Get(HeaderRequestID)
	if !saneID(id) {
		id = newRequestID()
		// One value for the request's and the response's header, held by
		// the writer, each capped so that an Add to one cannot write into
		// the other.
		ow.id[0] = id
		r.Header[HeaderRequestID] = ow.id[:1:1]
		w.Header()[HeaderRequestID] = ow.id[:1:1]
	} else {
		ow.id[0] = id
		w.Header().Set(HeaderRequestID, id)
	}
	return ow
}

// record finishes the observation of a request that has been answered:
// the latency and token metrics and the access log line. It is a function
// of its own, not the tail of ServeHTTP, so that its locals (the access
// log's attributes, 1.6 KiB) are not on the stack while the request is
// proxied: a held stream keeps the stack its deepest moment needed
// (proxy.prepare).
func (o *observed) record(ow *observingWriter, r *http.Request, start time.Time) {
	id := ow.id[0]
	tr := ow.trace
	end := o.now()
	ow.finish()

	ttft := time.Duration(-1)
	if !ow.ttftAt.IsZero() {
		ttft = ow.ttftAt.Sub(start)
	}
	model := tr.Model
	if model == "" {
		model = ow.read.Model
	}
	relayed := tr.Replica != "" && ow.status < 300 && ow.status >= 200
	if relayed {
		o.metrics.Completion(model, tr.Reason, ttft, end.Sub(start), ow.read.Usage)
		if u := ow.read.Usage; o.bal != nil && tr.Res != nil && u.CachedReported {
			o.bal.Cached(tr.Res, int(min(u.CachedTokens, math.MaxInt32)))
		}
		if engine := ow.read.Usage.PromptTokens; tr.ModelTokens > 0 && engine > 0 {
			o.metrics.TokenizerCheck(model, int64(tr.ModelTokens) == engine)
			if int64(tr.ModelTokens) != engine && o.log.Enabled(context.Background(), slog.LevelDebug) {
				o.log.LogAttrs(context.Background(), slog.LevelDebug, "prompt tokens differ from the engine's",
					slog.String("request_id", id), slog.String("model", model), slog.String("replica", tr.Replica),
					slog.Int("llmlb_tokens", tr.ModelTokens), slog.Int64("engine_tokens", engine))
			}
		}
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
	if tr.Queued {
		attrs = append(attrs, slog.Int64("queue_wait_ms", tr.QueueWait.Milliseconds()))
	}
	if tr.Flow != "" {
		attrs = append(attrs, slog.String("flow", tr.Flow))
	}
	if ttft >= 0 {
		attrs = append(attrs, slog.Duration("ttft", ttft))
	}
	if u := ow.read.Usage; u != (openai.TokenCounts{}) {
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
	flusher http.Flusher // the ResponseWriter's, if it is one
	now     func() time.Time
	trace   *proxy.Trace // UsageAsked: hold lines back and drop the usage chunk
	tr      proxy.Trace  // what trace points at when the writer owns it
	id      [1]string    // a generated request id, both headers' value

	status int
	bytes  int64
	kind   int    // 0 unknown, 1 event stream, 2 JSON, 3 other
	line   []byte // a stripped stream's line not yet relayed
	ttftAt time.Time
	read   openai.UsageReader // the model, the usage and the first token
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
		// Flushed before it is read: decoding a chunk (every one before
		// the first token) must not delay it. The flush that follows
		// (ReverseProxy flushes every write of a stream) finds nothing left.
		if n > 0 {
			if w.flusher != nil { // not flushClient: one frame less (proxy.prepare)
				w.flusher.Flush()
			} else {
				w.flushClient()
			}
		}
		w.read.Stream(p[:n])
		w.sawToken()
	case kindJSON:
		w.read.Body(p[:n])
	}
	return n, err
}

// writeStripped relays a stream whose usage chunk the client did not ask
// for: whole lines only (a partial line waits for its end), minus the
// data line of the usage-only chunk. It reports p as written. A line that
// cannot be that chunk (no "usage" member, or a null one) is relayed and
// flushed before it is read, so that decoding it does not delay it; one
// that may be is read first, to know whether to drop it.
//
// The lines relayed last are flushed and read here, not in relayLines:
// one frame less under ReverseProxy's copy loop, where a proxied stream's
// stack is deepest, and a held stream keeps the stack it needed
// (proxy.prepare).
func (w *observingWriter) writeStripped(p []byte) (int, error) {
	unread, end, err := w.relayLines(p)
	if err != nil {
		return 0, err
	}
	if unread >= 0 {
		if w.flusher != nil { // not flushClient: one frame less
			w.flusher.Flush()
		} else {
			w.flushClient()
		}
		w.readRelayed(unread, end)
	}
	if err := w.keepRest(end); err != nil {
		return 0, err
	}
	return len(p), nil
}

// relayLines appends p to the held line and relays its whole lines up to
// end (writeStripped); w.line[unread:end] are relayed lines not yet read
// and flushed (unread -1: none).
func (w *observingWriter) relayLines(p []byte) (unread, end int, err error) {
	w.line = append(w.line, p...)
	start := 0
	unread = -1
	for {
		i := bytes.IndexByte(w.line[start:], '\n')
		if i < 0 {
			break
		}
		lineStart := start
		line := w.line[start : start+i+1]
		start += i + 1
		if openai.MayBeUsageOnly(line) {
			if unread >= 0 { // in order: the model is the first chunk's
				w.flushClient()
				w.readRelayed(unread, lineStart)
				unread = -1
			}
			usageOnly := w.read.Line(line[:len(line)-1])
			w.sawToken()
			if usageOnly {
				continue // the usage chunk: counted, not relayed
			}
		} else if unread < 0 {
			unread = lineStart
		}
		n, err := w.ResponseWriter.Write(line)
		w.bytes += int64(n)
		if err != nil {
			w.line = w.line[:0]
			return -1, 0, err
		}
	}
	return unread, start, nil
}

// keepRest keeps the held line's bytes from end, a line not complete yet;
// one longer than an SSE line may be is relayed as it is.
func (w *observingWriter) keepRest(end int) error {
	rest := copy(w.line, w.line[end:])
	w.line = w.line[:rest]
	if len(w.line) > openai.MaxSSELine { // not an event stream after all: pass it on
		n, err := w.ResponseWriter.Write(w.line)
		w.bytes += int64(n)
		w.line = w.line[:0]
		return err
	}
	return nil
}

// readRelayed reads the relayed lines w.line[from:to], flushed.
func (w *observingWriter) readRelayed(from, to int) {
	w.read.Stream(w.line[from:to])
	w.sawToken()
}

// Flush implements http.Flusher (streams are flushed chunk by chunk).
func (w *observingWriter) Flush() { w.flushClient() }

// flushClient sends what the response holds to the client.
func (w *observingWriter) flushClient() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// ProxyTrace implements proxy.TracedWriter: the proxy fills the Trace.
func (w *observingWriter) ProxyTrace() *proxy.Trace { return w.trace }

// Unwrap lets http.ResponseController reach the server's writer.
func (w *observingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// sawToken takes the time of the stream's first generated token, once
// the reader has seen it.
func (w *observingWriter) sawToken() {
	if w.ttftAt.IsZero() && w.read.Token {
		w.ttftAt = w.now()
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
	if w.kind == kindJSON {
		w.read.Finish()
	}
}
