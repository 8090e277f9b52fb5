package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/llmlb/llmlb/internal/config"
)

// connTransport is the proxy's transport to the replicas (issue 14): plain
// HTTP/1.1 on kept-alive connections, one request at a time per connection,
// written and read on the calling goroutine. http.Transport runs a read and
// a write goroutine per connection and hands every request and response
// between them and the caller; under load that hand-off, not the bytes, was
// the transport's cost. The request (headers and buffered body) leaves in
// one write from a pooled buffer.
//
// It keeps http.Transport's behaviour where the proxy relies on it: a dial
// error is a *net.OpError with Op "dial" (failover), the first-byte
// deadline is a net.Error timeout (504), the request's context cancels the
// dial, the wait and the body read, and a kept-alive connection found
// closed by the replica before it answered is retried once on a new one.
// Requests it does not handle (protocol upgrades, Expect, https, a body it
// cannot resend) go to fallback.
type connTransport struct {
	fallback    http.RoundTripper
	dial        func(ctx context.Context, network, addr string) (net.Conn, error)
	firstByte   time.Duration // response header deadline
	idleTimeout time.Duration // an idle connection older than this is closed
	maxIdle     int           // idle connections kept per replica
	now         func() time.Time

	mu   sync.Mutex
	idle map[string][]*upConn // by host:port, most recent last
}

// maxResponseHeaderBytes bounds a replica's response headers (as
// http.Transport's default MaxResponseHeaderBytes does, smaller).
const maxResponseHeaderBytes = 1 << 20

// writeBufSize is the pooled write buffer: a request of up to this many
// bytes (headers and body) leaves in one write.
const writeBufSize = 64 << 10

var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writeBufSize) }}

// bufWriter hides the *bufio.Writer type from Request.Write (see exchange)
// while keeping it an io.ByteWriter, so Request.Write adds no buffer.
type bufWriter struct{ *bufio.Writer }

// aLongTimeAgo is a deadline in the past: it interrupts a blocked read.
var aLongTimeAgo = time.Unix(1, 0)

// newConnTransport returns the transport New uses when Options.Transport
// is nil, with NewTransport(cfg) as its fallback.
func newConnTransport(cfg config.Proxy) *connTransport {
	std := NewTransport(cfg)
	return &connTransport{
		fallback:    std,
		dial:        std.DialContext,
		firstByte:   std.ResponseHeaderTimeout,
		idleTimeout: std.IdleConnTimeout,
		maxIdle:     std.MaxIdleConnsPerHost,
		now:         time.Now,
		idle:        make(map[string][]*upConn),
	}
}

// upConn is one connection to a replica.
type upConn struct {
	net.Conn
	key       string
	br        *bufio.Reader
	idleSince time.Time
	budget    int64 // bytes the response headers may still take; <0: no limit

	mu       sync.Mutex // guards canceled against the deadline setters
	canceled bool
}

// Read implements io.Reader for br, enforcing the header budget.
func (c *upConn) Read(p []byte) (int, error) {
	if c.budget >= 0 {
		if c.budget == 0 {
			return 0, errors.New("proxy: replica's response headers too large")
		}
		p = p[:min(int64(len(p)), c.budget)]
	}
	n, err := c.Conn.Read(p)
	if c.budget >= 0 {
		c.budget -= int64(n)
	}
	return n, err
}

// interrupt makes every blocked or later read and write fail: the
// request's context was cancelled.
func (c *upConn) interrupt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.canceled = true
	_ = c.Conn.SetDeadline(aLongTimeAgo)
}

// setReadDeadline sets a read deadline unless the request was cancelled
// (interrupt's past deadline must not be undone).
func (c *upConn) setReadDeadline(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.canceled {
		_ = c.Conn.SetReadDeadline(t)
	}
}

// handles reports whether RoundTrip can take r itself.
func handles(r *http.Request) bool {
	if r.URL.Scheme != "http" || r.Header.Get("Upgrade") != "" || r.Header.Get("Expect") != "" {
		return false
	}
	hasBody := r.Body != nil && r.Body != http.NoBody
	return !hasBody || (r.GetBody != nil && r.ContentLength > 0)
}

// RoundTrip implements http.RoundTripper.
func (t *connTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if !handles(r) {
		return t.fallback.RoundTrip(r)
	}
	ctx := r.Context()
	key := r.URL.Host
	if _, _, err := net.SplitHostPort(key); err != nil {
		key = net.JoinHostPort(strings.Trim(key, "[]"), "80")
	}
	for try := 0; ; try++ {
		if err := ctx.Err(); err != nil {
			closeBody(r)
			return nil, err
		}
		c := t.get(key)
		reused := c != nil
		if c == nil {
			conn, err := t.dial(ctx, "tcp", key)
			if err != nil {
				closeBody(r)
				return nil, err
			}
			c = &upConn{Conn: conn, key: key, budget: -1}
			c.br = bufio.NewReader(c)
		}
		if try > 0 && r.GetBody != nil {
			body, err := r.GetBody()
			if err != nil {
				c.Close()
				return nil, err
			}
			r.Body = body
		}
		res, stale, err := t.exchange(ctx, c, r)
		if err == nil {
			return res, nil
		}
		c.Close()
		// A kept-alive connection the replica had closed: nothing reached
		// it, so the request is sent again on a new connection, once.
		if stale && reused && try == 0 && ctx.Err() == nil {
			continue
		}
		closeBody(r)
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("%w (%v)", ctxErr, err)
		}
		return nil, err
	}
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		_ = r.Body.Close()
	}
}

// exchange writes r on c and reads the response's headers. stale reports a
// failure before any byte of an answer arrived (the connection was dead).
func (t *connTransport) exchange(ctx context.Context, c *upConn, r *http.Request) (res *http.Response, stale bool, err error) {
	c.mu.Lock()
	c.canceled = false
	c.mu.Unlock()
	stop := context.AfterFunc(ctx, c.interrupt)
	fail := func(e error, stale bool) (*http.Response, bool, error) {
		stop()
		return nil, stale, e
	}
	bw := writerPool.Get().(*bufio.Writer)
	bw.Reset(c)
	// Not a *bufio.Writer to Request.Write: it would flush the headers
	// before a body it does not know to be in memory (two writes).
	err = r.Write(bufWriter{bw}) // closes r.Body
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	writerPool.Put(bw)
	if err != nil {
		return fail(err, true)
	}
	if t.firstByte > 0 {
		c.setReadDeadline(t.now().Add(t.firstByte))
	}
	if _, err := c.br.Peek(1); err != nil {
		return fail(err, !isTimeout(err))
	}
	c.budget = maxResponseHeaderBytes
	for {
		res, err = http.ReadResponse(c.br, r)
		if err != nil {
			return fail(err, false)
		}
		// 1xx answers other than 101 precede the real one.
		if res.StatusCode >= 200 || res.StatusCode == http.StatusSwitchingProtocols {
			break
		}
	}
	c.budget = -1
	if res.StatusCode == http.StatusSwitchingProtocols {
		return fail(errors.New("proxy: unexpected 101 Switching Protocols"), false)
	}
	c.setReadDeadline(time.Time{})
	res.Body = &upBody{rc: res.Body, c: c, t: t, stop: stop, ctx: ctx,
		reuse: !res.Close && !r.Close, empty: res.Body == http.NoBody}
	return res, false, nil
}

// upBody is a response body on an upConn: read to its end, the connection
// goes back to the idle pool; closed before, it is closed.
type upBody struct {
	rc    io.ReadCloser
	c     *upConn
	t     *connTransport
	stop  func() bool
	ctx   context.Context
	reuse bool
	empty bool // http.NoBody: complete without a read
	done  bool
}

// Read implements io.Reader.
func (b *upBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.finish(true)
	case err != nil:
		b.finish(false)
		if ctxErr := b.ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (%v)", ctxErr, err)
		}
	}
	return n, err
}

// Close implements io.Closer.
func (b *upBody) Close() error {
	if !b.done {
		b.finish(b.empty)
	}
	return nil
}

// finish releases the connection: to the pool when the body was read
// whole and both sides keep it alive, else closed.
func (b *upBody) finish(complete bool) {
	b.done = true
	if !b.stop() { // the request was cancelled meanwhile
		complete = false
	}
	if complete && b.reuse && b.c.br.Buffered() == 0 {
		b.t.put(b.c)
		return
	}
	b.c.Close()
}

// get returns an idle connection to key, or nil.
func (t *connTransport) get(key string) *upConn {
	t.mu.Lock()
	defer t.mu.Unlock()
	list := t.idle[key]
	cutoff := t.now().Add(-t.idleTimeout)
	for len(list) > 0 {
		c := list[len(list)-1]
		list[len(list)-1] = nil
		list = list[:len(list)-1]
		if t.idleTimeout <= 0 || c.idleSince.After(cutoff) {
			t.idle[key] = list
			return c
		}
		c.Close()
	}
	delete(t.idle, key)
	return nil
}

// put keeps c for reuse, closing the oldest idle connection over maxIdle.
func (t *connTransport) put(c *upConn) {
	c.idleSince = t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	list := append(t.idle[c.key], c)
	if len(list) > t.maxIdle {
		list[0].Close()
		list = append(list[:0], list[1:]...)
	}
	t.idle[c.key] = list
}

// CloseIdleConnections closes every idle connection (and the fallback's).
func (t *connTransport) CloseIdleConnections() {
	t.mu.Lock()
	for key, list := range t.idle {
		for _, c := range list {
			c.Close()
		}
		delete(t.idle, key)
	}
	t.mu.Unlock()
	if ci, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		ci.CloseIdleConnections()
	}
}
