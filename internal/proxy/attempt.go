package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
)

type attemptKey struct{}

// attempt is one try of a request on one replica. Its fields are written
// only on the handler's goroutine (ReverseProxy runs Rewrite, ModifyResponse,
// ErrorHandler and the body copy there).
type attempt struct {
	res    *balancer.Reservation
	target *url.URL
	start  time.Time
	w      *trackingWriter

	err       error // failure before any response (ErrorHandler)
	status    int   // the replica's status code
	firstByte bool  // a body byte arrived
	eof       bool  // the body was read to its end
	bodyErr   error // the replica broke the body after the response began
}

func attemptFrom(ctx context.Context) *attempt {
	return ctx.Value(attemptKey{}).(*attempt)
}

// retry reports whether the attempt failed in a way another replica may
// fix: before any byte reached the client, not cancelled by the client, and
// not a first-byte timeout (which answers 504: the replica may be working).
func (a *attempt) retry() bool {
	switch {
	case a.err == nil, a.w.wrote:
		return false
	case errors.Is(a.err, context.Canceled):
		return false
	case isDial(a.err):
		return true // refused or connect timeout: nothing was sent
	case isTimeout(a.err):
		return false
	}
	return true
}

// outcome is how the attempt ended, for Release (health).
func (a *attempt) outcome(ctx context.Context) balancer.Outcome {
	switch {
	case a.err != nil && ctx.Err() != nil:
		return balancer.OutcomeCanceled
	case a.err != nil:
		return balancer.OutcomeTransportError
	case a.status >= 500:
		return balancer.OutcomeServerError
	case a.bodyErr != nil:
		return balancer.OutcomeTransportError
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

// trackingWriter knows whether anything reached the client: once it has,
// the request is never retried.
type trackingWriter struct {
	http.ResponseWriter
	wrote  bool
	status int
}

// WriteHeader implements http.ResponseWriter; 1xx answers do not commit.
func (t *trackingWriter) WriteHeader(code int) {
	if code >= 200 && !t.wrote {
		t.wrote, t.status = true, code
	}
	t.ResponseWriter.WriteHeader(code)
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
	_ = http.NewResponseController(t.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the server's writer.
func (t *trackingWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// upstreamBody wraps a replica's response body: it times the first byte,
// notes the end, and turns a break of an SSE stream into a final
// `data: {"error":...}` event so the client learns why the stream ended.
type upstreamBody struct {
	rc   io.ReadCloser
	a    *attempt
	p    *Proxy
	ctx  context.Context
	sse  bool
	tail []byte  // the error event still to be delivered
	last [2]byte // the last two bytes relayed: is an event boundary open?
	done bool
}

// Read implements io.Reader.
func (b *upstreamBody) Read(buf []byte) (int, error) {
	if b.done {
		return 0, io.EOF
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
	if n > 0 {
		if !b.a.firstByte {
			b.a.firstByte = true
			b.p.metrics.FirstByte(b.a.res.Replica, b.p.now().Sub(b.a.start))
		}
		if n >= 2 {
			b.last = [2]byte{buf[n-2], buf[n-1]}
		} else {
			b.last = [2]byte{b.last[1], buf[0]}
		}
	}
	switch {
	case err == nil:
	case err == io.EOF:
		b.a.eof = true
	case b.ctx.Err() != nil:
		// The client went away: pass the error on; nothing to tell anyone.
	default:
		b.a.bodyErr = err
		if b.sse {
			b.tail = b.errorEvent()
			return n, nil
		}
	}
	return n, err
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
	msg := "the stream from replica " + b.a.res.Replica + " broke before it ended"
	return append([]byte(pre), sseError(msg)...)
}

// Close implements io.Closer.
func (b *upstreamBody) Close() error { return b.rc.Close() }

// bufferPool recycles ReverseProxy's 32 KiB copy buffers across responses.
type bufferPool struct{ p sync.Pool }

// Get implements httputil.BufferPool.
func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[]byte); ok {
		return *v
	}
	return make([]byte, 32<<10)
}

// Put implements httputil.BufferPool.
func (b *bufferPool) Put(buf []byte) { b.p.Put(&buf) }
