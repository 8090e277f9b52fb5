package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/openai"
)

type attemptKey struct{}

// Causes of an attempt cancelled by the proxy itself.
var (
	// errReplicaEjected: the replica was ejected while the attempt waited
	// for its answer; nothing reached the client, so it fails over.
	errReplicaEjected = errors.New("proxy: replica ejected while the request waited for its answer")
	// errStreamIdle: the replica sent nothing for proxy.stream_idle_timeout.
	errStreamIdle = errors.New("proxy: replica sent nothing for proxy.stream_idle_timeout")
	// errReplicaAuth: the replica answered 401 or 403 to the api key
	// configured for it (replicas[].api_key): a replica misconfigured, or
	// its key rotated without llmlb's. A failure of the replica, tried
	// elsewhere, never shown to the client as its own key's rejection.
	errReplicaAuth = errors.New("proxy: replica rejected its configured api_key")
	// errRefused: the replica answered one of proxy.retry_statuses (the
	// attempt's refusal holds the answer); another replica is tried.
	errRefused = errors.New("proxy: replica refused the request")
	// errStreamIncomplete: an SSE stream of chat or completions ended
	// without "data: [DONE]" (e.g. the replica closed a stream sent without
	// chunked framing): the client did not get the whole answer.
	errStreamIncomplete = errors.New("proxy: stream ended before data: [DONE]")
	// errLineTooLong: an SSE line grew past openai.MaxSSELine without a
	// newline; whatever it is, it is not a stream a client can use.
	errLineTooLong = errors.New("proxy: SSE line longer than the limit")
)

// attempt is one try of a request on one replica. Its fields are written
// only on the handler's goroutine (ReverseProxy runs Rewrite, ModifyResponse,
// ErrorHandler and the body copy there); the idle timer and an ejection only
// cancel ctx.
type attempt struct {
	res    *balancer.Reservation
	target *url.URL
	body   *outBody // the request body, read whole
	start  time.Time
	w      *trackingWriter
	tw     trackingWriter // what w points at: one allocation for both

	client    context.Context // the client's request context
	ctx       context.Context // the attempt's: cancelled with a cause by the proxy
	cancel    context.CancelCauseFunc
	actx      attemptCtx    // ctx carrying the attempt, the outbound request's
	idleAfter time.Duration // proxy.stream_idle_timeout
	idle      *time.Timer   // nil until the idle timeout applies
	wantDone  bool          // chat or completions: an SSE answer must end with [DONE]
	http1     bool          // the client speaks HTTP/1.x (flushWhole)
	// tokenFirst: the path's SSE stream sends nothing before its first
	// token (openai.FirstChunkIsToken).
	tokenFirst bool

	// sent reads the request body to the replica: the transport's current
	// reader of body (rewrite and GetBody set it); first is the first
	// one, and ub the replica's answer as relayed: each in the attempt's
	// own allocation (an attempt has one of each).
	sent  *bytes.Reader
	first bytes.Reader
	ub    upstreamBody
	route [2]string // the route headers' values (proxy.route_headers)

	mayRetry  bool     // another attempt may follow: a refusal is held back
	refusal   *refusal // the replica's refusal, held back (proxy.retry_statuses)
	err       error    // failure before any response (ErrorHandler)
	status    int      // the replica's status code
	upgrade   bool     // the replica switched protocols (101, WebSocket)
	firstByte bool     // a body byte arrived
	eof       bool     // the body was read to its end
	bodyErr   error    // the replica broke the body after the response began
}

// refusal is a replica's answer that the proxy tries elsewhere, kept to be
// given to the client if no other replica is left.
type refusal struct {
	status int
	header http.Header
	body   []byte
}

// holdRefusal keeps the replica's refusal (its headers and at most
// maxRefusalBody of its body, read within the stream idle timeout) and
// returns the error that makes ReverseProxy give the attempt up, so that
// route tries another replica.
func (a *attempt) holdRefusal(res *http.Response) error {
	a.startIdle()
	body, err := io.ReadAll(io.LimitReader(res.Body, maxRefusalBody))
	a.stopIdle()
	h := res.Header.Clone()
	h.Del("Content-Length")
	a.refusal = &refusal{status: res.StatusCode, header: h, body: body}
	if err != nil {
		return fmt.Errorf("%w (%d %s; reading its body: %w)", errRefused, res.StatusCode, http.StatusText(res.StatusCode), err)
	}
	return fmt.Errorf("%w: %d %s", errRefused, res.StatusCode, http.StatusText(res.StatusCode))
}

func attemptFrom(ctx context.Context) *attempt {
	return ctx.Value(attemptKey{}).(*attempt)
}

// attemptCtx is the outbound request's context: the attempt's cancelable
// one, carrying the attempt itself (a field of the attempt, so no
// allocation of its own as context.WithValue would make).
type attemptCtx struct {
	context.Context
	a *attempt
}

// Value implements context.Context.
func (c *attemptCtx) Value(key any) any {
	if key == (attemptKey{}) {
		return c.a
	}
	return c.Context.Value(key)
}

// minReleasedBody is the size from which a request body is let go of
// once its answer is relayed (releaseBody): a stream holds what it
// references for as long as it lasts, and an agent's prompt is tens or
// hundreds of KiB. Smaller bodies are not worth the client trace it takes.
const minReleasedBody = 16 << 10

// wroteRequest is the outbound request's httptrace WroteRequest hook: the
// request and its body have been written (or failed), so the reader's
// bytes are not read again; a resend on a dead connection takes a new
// reader from GetBody. It runs on the transport's writing goroutine, after
// the write that read sent.
func (a *attempt) wroteRequest(httptrace.WroteRequestInfo) {
	if r := a.sent; r != nil {
		r.Reset(nil)
	}
}

// releaseBody drops the attempt's reference to the request body once the
// replica's answer is relayed: no other attempt follows and the transport
// resends nothing, so a long stream does not keep a large prompt alive
// (the transport's reader let go of it in wroteRequest).
func (a *attempt) releaseBody() {
	if a.body != nil && len(a.body.b) >= minReleasedBody {
		a.body.b = nil
	}
}

// startIdle arms (or re-arms) the idle timeout: without a byte from the
// replica for idleAfter, the attempt is cancelled with errStreamIdle.
func (a *attempt) startIdle() {
	if a.idle == nil {
		a.idle = time.AfterFunc(a.idleAfter, func() { a.cancel(errStreamIdle) })
		return
	}
	a.idle.Reset(a.idleAfter)
}

// stopIdle disarms the idle timeout.
func (a *attempt) stopIdle() {
	if a.idle != nil {
		a.idle.Stop()
	}
}

// retry reports whether the attempt failed in a way another replica may
// fix: before any byte reached the client, not cancelled by the client, and
// not a first-byte timeout (which answers 504: the replica may be working).
// A replica ejected meanwhile, or silent past the stream idle timeout on a
// streaming request (vLLM answers those at once), is not working: retried.
func (a *attempt) retry() bool {
	switch {
	case a.err == nil, a.w.wrote, a.upgrade:
		return false
	case a.client.Err() != nil:
		return false
	case errors.Is(a.err, errReplicaEjected), errors.Is(a.err, errStreamIdle):
		return true
	case errors.Is(a.err, context.Canceled):
		return false
	case isDial(a.err):
		return true // refused or connect timeout: nothing was sent
	case isTimeout(a.err):
		return false
	}
	return true
}

// outcome is how the attempt ended, for Release (health). A first-byte
// timeout, or the idle timeout before a streaming request's headers, is the
// replica's failure (docs/SECURITY.md, "LIVE but dead": a replica whose /metrics answers
// while its API hangs must still be ejected); an attempt cancelled because
// the replica was already ejected, a stream gone silent after its headers,
// and a protocol upgrade say nothing new about it.
func (a *attempt) outcome() balancer.Outcome {
	switch {
	case a.upgrade:
		return balancer.OutcomeCanceled
	case a.err != nil && a.client.Err() != nil:
		return balancer.OutcomeCanceled
	case errors.Is(a.err, errReplicaEjected):
		return balancer.OutcomeCanceled
	case errors.Is(a.err, errLoop):
		return balancer.OutcomeLoop
	case a.refusal != nil && a.refusal.status >= 500:
		return balancer.OutcomeServerError
	case a.refusal != nil:
		return balancer.OutcomeRejected // busy (429): healthy, computed nothing
	case a.err != nil:
		return balancer.OutcomeTransportError
	case a.status >= 500:
		return balancer.OutcomeServerError
	case errors.Is(a.bodyErr, errStreamIdle):
		// Silence inside a started stream may be an overloaded replica's
		// queue (vLLM sends the headers at once, the first token after the
		// wait): ejecting it would push its load onto the others. A hung
		// replica fails its scrapes and is ejected by them.
		return balancer.OutcomeCanceled
	case a.bodyErr != nil:
		return balancer.OutcomeTransportError
	case a.eof && a.status >= 400:
		return balancer.OutcomeRejected
	case a.eof:
		return balancer.OutcomeOK
	}
	// The body was not read to its end and the replica did not break it:
	// the client went away (or could not be written to).
	return balancer.OutcomeCanceled
}

func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// waitingSet holds the attempts waiting for their replica's answer, so
// that an ejection can fail them over at once. One set for all replicas: a
// set per replica was made anew whenever its last attempt left (two
// allocations a request at low concurrency), and an ejection, which walks
// them all, is rare.
type waitingSet struct {
	mu sync.Mutex
	m  map[*attempt]struct{}
}

func (s *waitingSet) add(a *attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[a] = struct{}{}
}

func (s *waitingSet) remove(a *attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, a)
}

// cancel cancels every attempt waiting on replica with cause.
func (s *waitingSet) cancel(replica string, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for a := range s.m {
		if a.res.Replica == replica {
			a.cancel(cause)
			delete(s.m, a)
		}
	}
}

// trackingWriter knows whether anything reached the client: once it has,
// the request is never retried.
type trackingWriter struct {
	http.ResponseWriter
	wrote  bool
	status int
	// flushHeader: the answer is an event stream, whose headers are sent
	// as soon as ReverseProxy writes them (modifyResponse sets it).
	flushHeader bool
}

// WriteHeader implements http.ResponseWriter; 1xx answers do not commit.
//
// An event stream's headers are flushed here, at once, rather than with
// its first chunk: writing the headers (net/http's chunkWriter.writeHeader
// and the sort of the header keys) is the deepest moment of a proxied
// request's stack, and under ReverseProxy's copy loop and the writers
// around it that moment needed more than 8 KiB, so every held stream kept
// a 16 KiB stack (memory per held stream; checked with debug.SetMaxStack(8192)
// on streams held through serve's handlers).
// The price is a write of its own for the headers when the replica sent
// them together with the first chunk.
func (t *trackingWriter) WriteHeader(code int) {
	if code >= 200 && !t.wrote {
		t.wrote, t.status = true, code
	}
	t.ResponseWriter.WriteHeader(code)
	if t.flushHeader && code >= 200 {
		t.Flush()
	}
}

// Write implements http.ResponseWriter.
func (t *trackingWriter) Write(b []byte) (int, error) {
	if !t.wrote {
		t.wrote, t.status = true, http.StatusOK
	}
	return t.ResponseWriter.Write(b)
}

// Flush implements http.Flusher.
func (t *trackingWriter) Flush() {
	if !t.wrote {
		t.wrote, t.status = true, http.StatusOK
	}
	if f, ok := t.ResponseWriter.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(t.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// broken reports whether the replica's answer broke after it began (cut,
// truncated, or silent past the idle timeout): the client got an error
// event or a cut connection, counted as a stream error.
func (a *attempt) broken() bool {
	return a.err == nil && !a.upgrade && a.status < 500 && a.bodyErr != nil
}

// upstreamBody wraps a replica's response body: it times the first byte,
// notes the end, re-arms the stream idle timeout on every byte, and turns a
// break of an SSE stream (or its end without "data: [DONE]" where that is
// the protocol) into a final `data: {"error":...}` event so the client
// learns why the stream ended.
type upstreamBody struct {
	rc       io.ReadCloser
	a        *attempt
	p        *Proxy
	sse      bool
	wantDone bool     // the stream must end with data: [DONE]
	tail     []byte   // the error event still to be delivered
	last     [2]byte  // the last two bytes relayed: is an event boundary open?
	end      [32]byte // the last bytes relayed, to find [DONE] at EOF
	endLen   int
	done     bool
	cut      error // a JSON answer broke: flush, then return it
	lineLen  int   // SSE: bytes relayed since the last newline
	// firstAt is when the first byte arrived; it is recorded (metrics, the
	// balancer's first token) by the next Read or Close, once the first
	// bytes are on their way to the client, not before they leave.
	firstAt      time.Time
	firstPending bool
	// length is the answer's Content-Length (-1: unknown), relayed the
	// bytes read so far, trailer whether trailers are announced: a JSON
	// answer relayed whole is flushed by Close (flushWhole).
	length  int64
	relayed int64
	trailer bool
}

// flushWhole sends a non-stream answer to the client as soon as all of it
// is relayed (its Content-Length read to the end, no trailers to follow),
// before the attempt's bookkeeping and the observer's (release, metrics,
// access log): net/http would otherwise send it when the handler returns.
// It is still one write with the headers. Over HTTP/2 the flush would
// cost a frame of its own (the stream's end follows in another), so there
// the answer leaves when the handler returns, as before.
func (b *upstreamBody) flushWhole() {
	if b.a.http1 && !b.sse && b.a.eof && !b.trailer && b.length > 0 && b.relayed == b.length {
		b.a.w.Flush()
	}
}

// noteFirstByte records the first byte's arrival, once.
func (b *upstreamBody) noteFirstByte() {
	if !b.firstPending {
		return
	}
	b.firstPending = false
	b.p.metrics.FirstByte(b.a.res.Replica, b.firstAt.Sub(b.a.start))
	// A stream's first chunk comes with its first token: the replica's
	// prefill for it is done (policy cost's pending work).
	if b.sse && b.a.tokenFirst {
		b.p.bal.FirstToken(b.a.res, b.firstAt)
	}
}

// Read implements io.Reader.
func (b *upstreamBody) Read(buf []byte) (int, error) {
	b.noteFirstByte()
	if b.done {
		return 0, io.EOF
	}
	if b.cut != nil {
		// The bytes before the break were written: deliver them (and the
		// status) before ReverseProxy aborts the connection.
		b.a.w.Flush()
		return 0, b.cut
	}
	if b.tail != nil {
		n := copy(buf, b.tail)
		b.tail = b.tail[n:]
		if len(b.tail) == 0 {
			b.done = true
			return n, io.EOF
		}
		return n, nil
	}
	n, err := b.rc.Read(buf)
	b.relayed += int64(n)
	if n > 0 {
		if b.a.idle != nil && b.sse {
			b.a.startIdle()
		}
		if !b.a.firstByte {
			b.a.firstByte = true
			b.firstAt, b.firstPending = b.p.now(), true
		}
		if n >= 2 {
			b.last = [2]byte{buf[n-2], buf[n-1]}
		} else {
			b.last = [2]byte{b.last[1], buf[0]}
		}
		if b.wantDone {
			b.remember(buf[:n])
		}
		if b.sse {
			if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
				b.lineLen = n - i - 1
			} else {
				b.lineLen += n
			}
			if b.lineLen > openai.MaxSSELine && err == nil {
				b.a.bodyErr = errLineTooLong
				b.tail = b.errorEvent()
				_ = b.rc.Close()
				return n, nil
			}
		}
	}
	switch {
	case err == nil:
	case err == io.EOF && b.wantDone && !openai.EndsWithDone(b.end[:b.endLen]):
		b.a.bodyErr = errStreamIncomplete
		b.tail = b.errorEvent()
		return n, nil
	case err == io.EOF:
		b.a.eof = true
	case b.a.client.Err() != nil:
		// The client went away: pass the error on; nothing to tell anyone.
	default:
		if b.a.ctx.Err() != nil {
			if cause := context.Cause(b.a.ctx); errors.Is(cause, errStreamIdle) {
				err = cause
			}
		}
		b.a.bodyErr = err
		if b.sse {
			b.tail = b.errorEvent()
			return n, nil
		}
		// A JSON answer is not flushed as it goes (one write per answer): without a
		// flush the abort would drop its status and bytes, and the client
		// would see a bare reset instead of a cut answer.
		if n > 0 {
			b.cut = err
			return n, nil
		}
		b.a.w.Flush()
	}
	return n, err
}

// remember keeps the last bytes of the stream.
func (b *upstreamBody) remember(p []byte) {
	if len(p) >= len(b.end) {
		copy(b.end[:], p[len(p)-len(b.end):])
		b.endLen = len(b.end)
		return
	}
	keep := min(b.endLen, len(b.end)-len(p))
	copy(b.end[:], b.end[b.endLen-keep:b.endLen])
	copy(b.end[keep:], p)
	b.endLen = keep + len(p)
}

// errorEvent is the SSE event that ends a broken stream, preceded by the
// line breaks that close an event the replica left half-written.
func (b *upstreamBody) errorEvent() []byte {
	var pre string
	switch {
	case !b.a.firstByte, b.last == [2]byte{'\n', '\n'}:
	case b.last[1] == '\n':
		pre = "\n"
	default:
		pre = "\n\n"
	}
	var msg string
	switch {
	case errors.Is(b.a.bodyErr, errStreamIdle):
		msg = fmt.Sprintf("the stream from replica %s sent nothing for %s", b.a.res.Replica, b.a.idleAfter)
	case errors.Is(b.a.bodyErr, errStreamIncomplete):
		msg = "the stream from replica " + b.a.res.Replica + " ended before data: [DONE]"
	case errors.Is(b.a.bodyErr, errLineTooLong):
		msg = fmt.Sprintf("the stream from replica %s sent a line longer than %d bytes", b.a.res.Replica, openai.MaxSSELine)
	default:
		msg = "the stream from replica " + b.a.res.Replica + " broke before it ended"
	}
	return append([]byte(pre), openai.ErrorEvent(openai.TypeServer, openai.CodeStreamBroken, msg)...)
}

// Close implements io.Closer.
func (b *upstreamBody) Close() error {
	b.flushWhole()
	b.noteFirstByte()
	return b.rc.Close()
}

// copyBufferSize is ReverseProxy's copy buffer: 8 KiB (NGINX's
// proxy_buffer_size) rather than ReverseProxy's own 32 KiB; a large JSON
// answer takes a few more reads.
const copyBufferSize = 8 << 10

// streamCopyBufferSize is the copy buffer of a request that asks for a
// stream: a stream holds its buffer as long as it lasts (memory per held
// stream), and an SSE chunk is a few hundred bytes; a larger burst takes
// more than one read, each relayed and flushed as it comes.
const streamCopyBufferSize = 2 << 10

// bufferPool recycles ReverseProxy's copy buffers of one size across
// responses. It holds them as pointers to arrays, which a slice converts
// to without an allocation (a *[]byte per Put was one allocation a request).
type bufferPool struct {
	size int // copyBufferSize or streamCopyBufferSize
	p    sync.Pool
}

// Get implements httputil.BufferPool.
func (b *bufferPool) Get() []byte {
	switch v := b.p.Get().(type) {
	case *[copyBufferSize]byte:
		return v[:]
	case *[streamCopyBufferSize]byte:
		return v[:]
	}
	return make([]byte, b.size)
}

// Put implements httputil.BufferPool.
func (b *bufferPool) Put(buf []byte) {
	switch len(buf) {
	case copyBufferSize:
		b.p.Put((*[copyBufferSize]byte)(buf))
	case streamCopyBufferSize:
		b.p.Put((*[streamCopyBufferSize]byte)(buf))
	}
}
