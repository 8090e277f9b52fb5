// Package proxy is llmlb's OpenAI-compatible balancing proxy: it
// reads a request once, profiles it, asks the routing core for a replica,
// relays the answer through httputil.ReverseProxy (SSE chunk by chunk) and
// releases the in-flight reservation when the response ends, fails or the
// client goes away. Failures before the first byte fail over to another
// replica; a stream broken mid-way ends with an SSE error event.
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/request"
)

// StatusClientClosed is the status counted (never sent) for a request whose
// client went away before any answer, after nginx's 499.
const StatusClientClosed = 499

// Header names set on every proxied response (docs/CONFIG.md, proxy.route_headers).
const (
	HeaderReplica = "X-LLMLB-Replica"
	HeaderRoute   = "X-LLMLB-Route"
)

// The route headers' names as keys of an http.Header (canonical form).
var (
	replicaKey   = http.CanonicalHeaderKey(HeaderReplica)
	routeKey     = http.CanonicalHeaderKey(HeaderRoute)
	queueWaitKey = http.CanonicalHeaderKey(HeaderQueueWait)
	// priorityKey is read on every request flow control admits:
	// Header.Get would canonicalize HeaderPriority, one allocation each
	// time.
	priorityKey = http.CanonicalHeaderKey(HeaderPriority)
)

// Defaults used when the corresponding Config field is zero.
const (
	DefaultMaxBodyBytes     = 32 << 20
	DefaultMaxAttempts      = 3
	DefaultConnectTimeout   = 5 * time.Second
	DefaultFirstByteTimeout = 10 * time.Minute
	DefaultReadBodyTimeout  = time.Minute
	// DefaultStreamIdleTimeout is proxy.stream_idle_timeout's default: the
	// longest silence of a replica during a stream (docs/SECURITY.md, "Hung replica").
	DefaultStreamIdleTimeout = time.Minute
)

// DefaultRetryStatuses are proxy.retry_statuses' default (used when the
// field is nil): a replica's answers that say it is busy (429) or
// unavailable (502 from a sidecar before it, 503), given before it computes
// anything, so another replica is tried. 500 is not among them: it may be
// the request's own fault, and retrying it would only repeat the failure
// on more replicas (and count towards their ejection); nor is 504: the
// replica behind a gateway may still be working, as after the proxy's own
// first-byte timeout.
var DefaultRetryStatuses = []int{http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable}

// maxRefusalBody bounds what is kept of a refusal's body while another
// replica is tried (the answer given if none is left).
const maxRefusalBody = 64 << 10

// Recorder receives the proxy's measurements (package admin's Metrics
// implements it). Implementations must be safe for concurrent use.
type Recorder interface {
	// Request counts one finished client request; replica and reason are
	// empty when the balancer answered itself.
	Request(replica string, reason balancer.Reason, code int)
	// FirstByte observes the time from selection to the first body byte.
	FirstByte(replica string, d time.Duration)
	// StreamError counts a response broken after its first byte.
	StreamError(replica string)
	// Failover counts an attempt that failed before the first byte.
	Failover(replica string)
}

// Options configures a Proxy. Balancer is required; the rest has defaults.
type Options struct {
	Balancer *balancer.Balancer
	Request  request.Config
	Proxy    Config
	// APIKey returns the replica's api key ("" = none); nil means none.
	APIKey func(replica string) string
	// Transport reaches the replicas; nil means NewTransport(Proxy).
	Transport http.RoundTripper
	// Metrics records measurements; nil records nothing.
	Metrics Recorder
	// Transitions receives the health transitions caused by Release (to log
	// and count them once); nil ignores them.
	Transitions func([]balancer.Transition)
	Logger      *slog.Logger
	Now         func() time.Time
	// Decisions receives every routing decision (attempt counts from 1),
	// for the dashboard's list of recent decisions; nil ignores them. It is
	// called on the request's goroutine and must return quickly.
	Decisions func(at time.Time, res *balancer.Reservation, prof *request.Profile, attempt int)
	// ReadBodyTimeout bounds reading a request body (slow clients get 408);
	// 0 means DefaultReadBodyTimeout. It is a wall-clock I/O deadline.
	ReadBodyTimeout time.Duration
	// Gate holds inference requests while every replica of their model is
	// full (flow control, package admission); nil routes every request at
	// once. Its owner calls Pump, Expire and Shutdown.
	Gate *admission.Gate
	// TenantFromAPIKey names a request's tenant after its API key
	// (request.KeyTenant) instead of request.tenant_headers
	// (flow_control.tenant_from: api_key).
	TenantFromAPIKey bool
	// InstanceID marks the requests this proxy forwards (HeaderVia) to
	// detect loops; "" draws a random one.
	InstanceID string
}

// Proxy is the http.Handler of the proxy listener.
type Proxy struct {
	bal         *balancer.Balancer
	reqCfg      request.Config
	cfg         Config
	apiKey      func(string) string
	metrics     Recorder
	transitions func([]balancer.Transition)
	decisions   func(time.Time, *balancer.Reservation, *request.Profile, int)
	log         *slog.Logger
	now         func() time.Time
	rp          *httputil.ReverseProxy
	rpStream    *httputil.ReverseProxy // rp with streamCopyBufferSize buffers
	bodyTimeout time.Duration
	waiting     waitingSet // attempts still waiting for their replica's answer
	targets     urlCache   // replicas' parsed URLs
	retryStatus map[int]bool

	// Flow control (flow.go); gate is nil without it.
	gate      *admission.Gate
	flowCfg   flowcontrol.Config
	keyTenant bool
	qrec      QueueRecorder // nil: the Recorder observes no waits
	ids       atomic.Uint64 // admission.Request ids
	waiters   atomic.Int64  // requests in or about to be in the queue
	stopping  chan struct{} // closed by Shutdown
	stopOnce  sync.Once

	id    string   // instance id, the mark on forwarded requests (loop.go)
	loops sync.Map // replica name -> true: its loop was logged
	// via is HeaderVia's value when the client sent none, {id}, shared by
	// the requests; capped so that an Add to one cannot write into it.
	via []string
}

// outBody is the request body the attempts send, read whole.
type outBody struct {
	b []byte
}

// urlCache keeps the replicas' URLs parsed: url.Parse per attempt was an
// avoidable cost under load (BENCHMARKS.md, proxy efficiency). It is cleared when it outgrows maxCachedURLs
// (replicas come and go with discovery).
type urlCache struct {
	mu sync.Mutex
	m  map[string]*url.URL
}

const maxCachedURLs = 1024

// parse returns raw parsed, or an error if it is not a URL with a host.
// The result is shared: callers must not modify it.
func (c *urlCache) parse(raw string) (*url.URL, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.m[raw]; ok {
		return u, nil
	}
	u, err := url.Parse(raw)
	if err == nil && u.Host == "" {
		err = errors.New("no host")
	}
	if err != nil {
		return nil, err
	}
	if c.m == nil || len(c.m) >= maxCachedURLs {
		c.m = make(map[string]*url.URL)
	}
	c.m[raw] = u
	return u, nil
}

// New returns a Proxy. It starts no goroutines.
func New(opts Options) (*Proxy, error) {
	if opts.Balancer == nil {
		return nil, errors.New("proxy: balancer is required")
	}
	cfg := opts.Proxy
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.StreamIdleTimeout <= 0 {
		cfg.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	if cfg.RetryStatuses == nil {
		cfg.RetryStatuses = DefaultRetryStatuses
	}
	retryStatus := make(map[int]bool, len(cfg.RetryStatuses))
	for _, s := range cfg.RetryStatuses {
		retryStatus[s] = true
	}
	p := &Proxy{
		waiting:     waitingSet{m: make(map[*attempt]struct{})},
		bal:         opts.Balancer,
		reqCfg:      opts.Request,
		cfg:         cfg,
		apiKey:      opts.APIKey,
		metrics:     opts.Metrics,
		transitions: opts.Transitions,
		decisions:   opts.Decisions,
		log:         opts.Logger,
		now:         opts.Now,
		bodyTimeout: opts.ReadBodyTimeout,
		retryStatus: retryStatus,
		gate:        opts.Gate,
		keyTenant:   opts.TenantFromAPIKey,
		stopping:    make(chan struct{}),
		id:          opts.InstanceID,
	}
	if p.id == "" {
		p.id = newInstanceID()
	}
	p.via = []string{p.id}[:1:1]
	if p.gate != nil {
		p.flowCfg = p.gate.Config()
		if !p.flowCfg.Enabled {
			p.gate = nil
		}
	}
	if p.bodyTimeout <= 0 {
		p.bodyTimeout = DefaultReadBodyTimeout
	}
	if p.apiKey == nil {
		p.apiKey = func(string) string { return "" }
	}
	if p.metrics == nil {
		p.metrics = nopRecorder{}
	}
	p.qrec, _ = p.metrics.(QueueRecorder)
	if p.transitions == nil {
		p.transitions = func([]balancer.Transition) {}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.now == nil {
		p.now = time.Now
	}
	tr := opts.Transport
	if tr == nil {
		tr = NewTransport(cfg)
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: tr,
		// 0, not -1: ReverseProxy flushes every write of a text/event-stream
		// answer (and of one without Content-Length) by itself, so SSE
		// chunks still go out at once, while a JSON answer of known length
		// leaves in one write with its headers, without a flush timer per
		// response (18% of the CPU under JSON load went there).
		FlushInterval:  0,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.errorHandler,
		BufferPool:     &bufferPool{size: copyBufferSize},
		ErrorLog:       slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
	}
	// A request that asks for a stream is relayed with a smaller copy
	// buffer: it holds its buffer as long as the stream lasts, and SSE
	// chunks are a few hundred bytes each.
	rpStream := *p.rp
	rpStream.BufferPool = &bufferPool{size: streamCopyBufferSize}
	p.rpStream = &rpStream
	return p, nil
}

// NewTransport returns the transport to the replicas: a dial timeout of
// cfg.ConnectTimeout, a response header deadline of cfg.FirstByteTimeout
// (504 after it), no HTTP/2 and no transparent compression.
func NewTransport(cfg Config) *http.Transport {
	connect := cfg.ConnectTimeout
	if connect <= 0 {
		connect = DefaultConnectTimeout
	}
	firstByte := cfg.FirstByteTimeout
	if firstByte <= 0 {
		firstByte = DefaultFirstByteTimeout
	}
	d := &net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 nil, // replicas are reached directly, never via HTTP_PROXY
		DialContext:           d.DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: firstByte,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		// Every connection to a replica keeps its buffers while a stream
		// is held: the defaults (4 KiB each) are for bodies written and
		// read through them, where a request body passes the write
		// buffer after its first KiB (bufio.Writer.ReadFrom hands the
		// rest to the connection) and SSE chunks are small. 5 KiB less
		// per connection: memory per held stream 59.9 -> 56.1 KiB, CPU
		// and throughput unchanged (scripts/proxybench.sh).
		ReadBufferSize:  2 << 10,
		WriteBufferSize: 1 << 10,
	}
}

// ServeHTTP implements http.Handler.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if st := p.prepare(w, r); st != nil {
		p.route(w, r, st)
	}
}

// prepare reads and profiles a request to route, or answers it itself (a
// loop, a path outside the API, the model list, a body too large or
// malformed) and returns nil. It is a function of its own so that its
// locals are not on the stack while the request is proxied: a held
// stream's goroutine keeps the stack the deepest moment of its request
// needed, and the moments under ReverseProxy (the answer's headers
// written, its chunks read for the usage) are the deepest; an 8 KiB stack
// holds a stream only with these frames small (memory per held stream;
// see trackingWriter.WriteHeader).
func (p *Proxy) prepare(w http.ResponseWriter, r *http.Request) *routed {
	if p.looped(r) {
		p.refuseLoop(w)
		return nil
	}
	path := r.URL.Path
	// Path traversal (/v1/../metrics or /v1/%2e%2e/health would reach the
	// replica's own endpoints outside /v1/) and paths outside the API are
	// answered here; so is the model list, the union of the replicas'.
	if a, ok := openai.CheckPath(path); !ok {
		p.answerWith(w, a)
		return nil
	}
	if r.Method == http.MethodGet && openai.IsModelsPath(path) {
		status, body := openai.ModelsAnswer(path, p.bal.Models(), "llmlb")
		p.metrics.Request("", "", status)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return nil
	}

	body, ok := p.readBody(w, r)
	if !ok {
		return nil
	}
	// The profile and the outbound body live as long as each other: one
	// allocation for both.
	st := &routed{}
	prof, out := &st.prof, &st.out
	if r.Method == http.MethodPost && request.Routed(path) {
		var err error
		*prof, err = request.Parse(p.reqCfg, path, r.Header, body)
		if err != nil {
			putBody(body)
			p.answer(w, http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON, err.Error())
			return nil
		}
	}
	out.b = askUsage(traceOf(w, r.Context()), path, prof, body)
	if len(out.b) != len(body) {
		putBody(body) // askUsage made a new body; nothing else has this one
	}
	// A routed body is not pooled: http.Transport may still be writing it
	// after RoundTrip returned, and it writes headers and body in one go
	// only for a body it knows is in memory (a bytes.Reader), whose end it
	// does not report. It is left to the garbage collector.
	return st
}

// routed is a request on its way to a replica: its profile and the body
// the attempts send, and flow control's records of it (admit), all in one
// allocation.
type routed struct {
	prof request.Profile
	out  outBody
	areq admission.Request
	held held
	wait waiter
}

// readBody reads the whole request body under the size limit; over it the
// client gets 413 without the rest being read.
func (p *Proxy) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	tooLarge := func() ([]byte, bool) {
		msg := fmt.Sprintf("request body exceeds the limit of %d bytes", p.cfg.MaxBodyBytes)
		p.answer(w, http.StatusRequestEntityTooLarge, openai.TypeInvalidRequest, openai.CodeTooLarge, msg)
		return nil, false
	}
	if r.ContentLength > p.cfg.MaxBodyBytes {
		return tooLarge()
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	// No http.Server.ReadTimeout (it would cut long streams): the body alone
	// gets a deadline, lifted once it is read, so a slow body cannot hold a
	// handler forever.
	// On a failed read the deadline stays: it also bounds the server's
	// discarding of the unread rest after the error answer.
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(p.bodyTimeout)) == nil
	body, err := readGrowing(http.MaxBytesReader(w, r.Body, p.cfg.MaxBodyBytes), r.ContentLength)
	if err != nil {
		putBody(body)
	}
	switch {
	case err == nil:
	case isMaxBytes(err):
		return tooLarge()
	case isTimeout(err):
		w.Header().Set("Connection", "close")
		msg := fmt.Sprintf("request body not received within %s", p.bodyTimeout)
		p.answer(w, http.StatusRequestTimeout, openai.TypeInvalidRequest, openai.CodeBodyTimeout, msg)
		return nil, false
	default:
		p.answer(w, http.StatusBadRequest, openai.TypeInvalidRequest, openai.CodeInvalidJSON, "reading the request body failed")
		return nil, false
	}
	if deadline {
		_ = rc.SetReadDeadline(time.Time{}) // streams must not inherit it
	}
	// Read to its end, the body is closed now rather than when the handler
	// returns: an HTTP/1 server otherwise looks for an unread rest of it on
	// the answer's first write (io.CopyN into io.Discard, an allocation and
	// a read per request), the deepest moment of a proxied request's stack
	// (see prepare).
	_ = r.Body.Close()
	return body, true
}

// isMaxBytes reports whether err is http.MaxBytesReader's. Its own
// function, as isTimeout: the target errors.As needs would otherwise be
// allocated on every request, not only on the error path.
func isMaxBytes(err error) bool {
	var mbe *http.MaxBytesError
	return errors.As(err, &mbe)
}

// readGrowing reads r to its end. The buffer grows only as bytes arrive
// (doubling, from the announced length + 1 or 16 KiB, whichever is
// smaller), so a client that announces 32 MB and sends one byte costs a few
// KiB, not 32 MB held for read_body_timeout (docs/SECURITY.md, "Memory before the body arrives"). Buffers
// of minPooledBody and more come from bodyPool (fewer allocations per request); the caller may
// hand the result back with putBody when nothing reads it any more (a body
// that was not routed). The caller bounds r.
func readGrowing(r io.Reader, announced int64) ([]byte, error) {
	const first = 16 << 10
	size := int64(first)
	if announced >= 0 && announced < size-1 {
		size = announced + 1 // +1: room to see EOF without growing
	}
	var buf []byte
	if size < minPooledBody {
		// A small body of known length (a usual chat request is a few
		// hundred bytes) gets a buffer of its own size: a routed body never
		// goes back to the pool, so the pool's 4 KiB would only be garbage
		// many times the body's size.
		buf = make([]byte, 0, size)
	} else {
		buf = getBody(int(size))
	}
	for {
		if len(buf) == cap(buf) {
			next := int64(cap(buf)) * 2
			if announced >= int64(len(buf)) && announced < next-1 {
				next = announced + 1
			}
			grown := append(getBody(int(next)), buf...)
			putBody(buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// Request bodies are pooled in power-of-two classes from minPooledBody to
// maxPooledBody bytes; larger ones are left to the garbage collector.
const (
	minPooledBody = 4 << 10
	maxPooledBody = 8 << 20
)

var bodyPool [24 - 12 + 1]sync.Pool // classes 2^12 .. 2^23 (and 2^24 unused)

// bodyClass is the pool class whose buffers hold size bytes; -1 if none.
func bodyClass(size int) int {
	if size > maxPooledBody {
		return -1
	}
	return max(bits.Len(uint(size-1)), 12) - 12
}

// getBody returns an empty buffer of at least size bytes.
func getBody(size int) []byte {
	c := bodyClass(size)
	if c < 0 {
		return make([]byte, 0, size)
	}
	if v, ok := bodyPool[c].Get().(*[]byte); ok {
		return (*v)[:0]
	}
	return make([]byte, 0, minPooledBody<<c)
}

// putBody returns a buffer of getBody's to the pool. Nothing may read or
// write it afterwards.
func putBody(b []byte) {
	c := cap(b)
	if c < minPooledBody || c > maxPooledBody || c&(c-1) != 0 {
		return
	}
	b = b[:0]
	bodyPool[bodyClass(c)].Put(&b)
}

// answer writes an error produced by the balancer itself and counts it.
func (p *Proxy) answer(w http.ResponseWriter, status int, typ, code, msg string) {
	p.metrics.Request("", "", status)
	openai.WriteError(w, status, typ, code, msg)
}

// answerWith is answer for a prepared Answer.
func (p *Proxy) answerWith(w http.ResponseWriter, a openai.Answer) {
	p.answer(w, a.Status, a.Type, a.Code, a.Message)
}

// route selects, proxies and fails over (docs/ROUTING.md, "Selection"; ARCHITECTURE.md, "Attempt"): at most
// MaxAttempts distinct replicas, and never once a byte reached the client.
// A replica's refusal (proxy.retry_statuses) is tried elsewhere too, but
// given to the client as the replica sent it when no other is left.
// Flow control comes first (admit): a request that waited and was
// dispatched late makes its first attempt on the replica reserved for it.
func (p *Proxy) route(w http.ResponseWriter, r *http.Request, st *routed) {
	body, prof := &st.out, &st.prof
	h, ok := p.admit(w, r, st)
	if !ok {
		return
	}
	if h != nil {
		defer func() { p.gate.Done(h.req, p.now()) }()
	}
	ctx := r.Context()
	tr := traceOf(w, ctx)
	var tried []string
	var last *attempt
	for n := 0; n < p.cfg.MaxAttempts; n++ {
		res, err := p.pick(ctx, tr, prof, h, n, tried)
		if err != nil {
			p.selectFailed(w, err, prof, last)
			return
		}
		a := p.try(w, r, body, res, prof, n+1 < p.cfg.MaxAttempts)
		if !a.retry() {
			return
		}
		p.failedOver(ctx, a, n+1)
		tried = append(tried, res.Replica)
		last = a
		if ctx.Err() != nil {
			return
		}
	}
	p.attemptsFailed(w, last, len(tried))
}

// failedOver counts and logs attempt n, failed before the first byte.
// This and attemptsFailed are functions of their own to keep their locals
// off the stack while a request is proxied (see prepare).
func (p *Proxy) failedOver(ctx context.Context, a *attempt, n int) {
	p.metrics.Failover(a.res.Replica)
	p.log.LogAttrs(ctx, slog.LevelWarn, "proxy: attempt failed before the first byte",
		slog.String("replica", a.res.Replica), slog.Int("attempt", n), slog.String("error", a.err.Error()))
}

// attemptsFailed answers when every attempt failed before the first byte.
func (p *Proxy) attemptsFailed(w http.ResponseWriter, last *attempt, tried int) {
	if errors.Is(last.err, errLoop) {
		p.answerLoop(w, last.res.Replica)
		return
	}
	msg := fmt.Sprintf("upstream failure after %d attempts (last replica %s)", tried, last.res.Replica)
	p.answer(w, http.StatusBadGateway, openai.TypeServer, openai.CodeUpstreamError, msg)
}

// pick reserves the replica of attempt n (from 0): the one flow control
// reserved for a request that waited, or Select's choice among those not
// tried yet; the decision is logged and noted. A function of its own to
// keep its locals off the stack while a request is proxied (see prepare).
func (p *Proxy) pick(ctx context.Context, tr *Trace, prof *request.Profile, h *held, n int, tried []string) (*balancer.Reservation, error) {
	var res *balancer.Reservation
	now := p.now() // one reading for the choice and its record
	if n == 0 && h != nil && h.res != nil {
		res = h.res
	} else {
		var err error
		if res, err = p.bal.Select(prof, now, tried...); err != nil {
			return nil, err
		}
		if h != nil {
			res.Explanation.Queued = h.waited
		}
	}
	p.logDecision(ctx, res, prof, n)
	noteDecision(tr, res, prof, n+1)
	if p.decisions != nil {
		p.decisions(now, res, prof, n+1)
	}
	return res, nil
}

// selectFailed answers when Select finds no replica.
func (p *Proxy) selectFailed(w http.ResponseWriter, err error, prof *request.Profile, last *attempt) {
	switch {
	case last != nil && errors.Is(last.err, errLoop) && errors.Is(err, balancer.ErrNoHealthyInstances):
		p.answerLoop(w, last.res.Replica)
	case last != nil && last.refusal != nil && errors.Is(err, balancer.ErrNoHealthyInstances):
		p.replayRefusal(w, last)
	case errors.Is(err, balancer.ErrUnknownModel):
		p.answerWith(w, openai.ModelNotFound(prof.Model))
	case errors.Is(err, balancer.ErrNoHealthyInstances):
		msg := "no healthy replica is available"
		if last != nil {
			msg = fmt.Sprintf("no healthy replica is left after a failure on %s", last.res.Replica)
		}
		p.answer(w, http.StatusServiceUnavailable, openai.TypeUnavailable, openai.CodeNoHealthyInstances, msg)
	default:
		p.log.Error("proxy: select failed", slog.String("error", err.Error()))
		p.answer(w, http.StatusInternalServerError, openai.TypeServer, openai.CodeInternal, "routing failed")
	}
}

// replayRefusal answers with the refusal attempt a kept: no other replica
// was left to try, so the client gets the replica's own answer (its status,
// headers such as Retry-After, and body).
func (p *Proxy) replayRefusal(w http.ResponseWriter, a *attempt) {
	rf := a.refusal
	h := w.Header()
	for k, v := range rf.header {
		h[k] = v
	}
	h.Set("Content-Length", strconv.Itoa(len(rf.body)))
	p.metrics.Request(a.res.Replica, a.res.Reason, rf.status)
	w.WriteHeader(rf.status)
	_, _ = w.Write(rf.body)
}

// logDecision writes the one debug line per routing decision. It never logs
// headers (Authorization) or keys' values beyond whether they are present.
func (p *Proxy) logDecision(ctx context.Context, res *balancer.Reservation, prof *request.Profile, attempt int) {
	if !p.log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	attrs := append([]slog.Attr{
		slog.String("replica", res.Replica),
		slog.String("reason", string(res.Reason)),
		slog.Int("attempt", attempt+1),
		slog.String("model", prof.Model),
		slog.Bool("session", prof.SessionKey != ""),
		slog.Bool("prefix", prof.PrefixKey != ""),
		slog.Int("prompt_tokens", prof.PromptTokens),
	}, res.Explanation.LogAttrs()...)
	p.log.LogAttrs(ctx, slog.LevelDebug, "route", attrs...)
}

// try runs one attempt on the reserved replica and releases the reservation
// when it ends, also when ReverseProxy aborts the handler with
// http.ErrAbortHandler (the deferred release runs while the panic unwinds).
// mayRetry says another attempt may follow: a refusal is then held back.
func (p *Proxy) try(w http.ResponseWriter, r *http.Request, body *outBody, res *balancer.Reservation, prof *request.Profile, mayRetry bool) *attempt {
	// The attempt's setup, end and failure answers are functions of their
	// own: their locals stay off the stack while the answer is relayed
	// (see prepare).
	a := p.newAttempt(w, r, res, mayRetry)
	defer p.endAttempt(a)
	in := p.outbound(a, r, body, prof)
	if in == nil {
		return a
	}
	rp := p.rp
	if prof.Stream {
		rp = p.rpStream
	}
	rp.ServeHTTP(a.w, in)
	if a.err != nil && !a.retry() && !a.w.wrote && a.client.Err() == nil {
		p.answerUnanswered(a)
	}
	return a
}

// newAttempt starts an attempt on the reserved replica.
func (p *Proxy) newAttempt(w http.ResponseWriter, r *http.Request, res *balancer.Reservation, mayRetry bool) *attempt {
	ctx, cancel := context.WithCancelCause(r.Context())
	a := &attempt{res: res, start: p.now(), tw: trackingWriter{ResponseWriter: w}, mayRetry: mayRetry,
		client: r.Context(), ctx: ctx, cancel: cancel, idleAfter: p.cfg.StreamIdleTimeout,
		http1:      r.ProtoMajor == 1,
		wantDone:   r.Method == http.MethodPost && openai.CompletionsPath(r.URL.Path),
		tokenFirst: r.Method == http.MethodPost && openai.FirstChunkIsToken(r.URL.Path)}
	a.w = &a.tw
	return a
}

// endAttempt counts the attempt's answer and releases its reservation.
func (p *Proxy) endAttempt(a *attempt) {
	res := a.res
	a.stopIdle()
	a.cancel(nil)
	p.waiting.remove(a)
	o := a.outcome()
	if a.broken() {
		p.metrics.StreamError(res.Replica)
		p.log.Warn("proxy: response broken after the first byte",
			slog.String("replica", res.Replica), slog.Any("error", a.bodyErr))
	}
	switch {
	case a.retry():
	case a.upgrade && a.err == nil:
		p.metrics.Request(res.Replica, res.Reason, http.StatusSwitchingProtocols)
	case a.w.status != 0:
		p.metrics.Request(res.Replica, res.Reason, a.w.status)
	case o == balancer.OutcomeCanceled:
		p.metrics.Request(res.Replica, res.Reason, StatusClientClosed)
	}
	p.release(res, o)
}

// outbound is the request an attempt hands ReverseProxy, registered as
// waiting for its replica's answer; nil (with a.err set) if the replica's
// URL is bad.
func (p *Proxy) outbound(a *attempt, r *http.Request, body *outBody, prof *request.Profile) *http.Request {
	res := a.res
	target, err := p.targets.parse(res.URL)
	if err != nil {
		a.err = fmt.Errorf("proxy: replica %s has a bad url: %w", res.Replica, err)
		return nil
	}
	a.target = target

	// Registered before the request goes out: an ejection of the replica
	// cancels the attempt while it waits for the answer (docs/SECURITY.md, "Hung replica").
	p.waiting.add(a)
	if prof.Stream {
		// vLLM answers a streaming request's headers at once: a replica
		// silent this long before them is hung (docs/SECURITY.md, "Hung replica" and "LIVE but dead").
		a.startIdle()
	}
	a.body = body
	a.actx = attemptCtx{Context: a.ctx, a: a}
	var out context.Context = &a.actx
	if len(body.b) >= minReleasedBody {
		// Told when the body has been written, the attempt lets go of
		// its reader's bytes (see releaseBody).
		out = httptrace.WithClientTrace(out, &httptrace.ClientTrace{WroteRequest: a.wroteRequest})
	}
	in := r.WithContext(out)
	in.ContentLength = int64(len(body.b))
	in.TransferEncoding = nil
	in.Body = http.NoBody // rewrite gives the outbound request its body
	in.GetBody = nil
	return in
}

// answerUnanswered answers for an attempt that failed, is not retried and
// sent nothing yet. A function of its own to keep its locals off the stack
// while a request is proxied (see prepare).
func (p *Proxy) answerUnanswered(a *attempt) {
	res := a.res
	if a.upgrade {
		msg := fmt.Sprintf("the protocol upgrade through replica %s failed", res.Replica)
		openai.WriteError(a.w, http.StatusBadGateway, openai.TypeServer, openai.CodeUpstreamError, msg)
		return
	}
	// Not retryable and nothing sent yet: a first-byte timeout (504).
	p.log.Warn("proxy: replica did not answer in time",
		slog.String("replica", res.Replica), slog.String("error", a.err.Error()))
	msg := fmt.Sprintf("replica %s did not answer in time", res.Replica)
	openai.WriteError(a.w, http.StatusGatewayTimeout, openai.TypeTimeout, openai.CodeUpstreamTimeout, msg)
}

// Ejected fails over every request still waiting for replica's answer
// (nothing of it reached its client yet): the replica was just ejected, so
// waiting up to first_byte_timeout would only delay the client (docs/SECURITY.md,
// "Hung replica"). The server calls it for every transition to EJECTED.
func (p *Proxy) Ejected(replica string) {
	p.waiting.cancel(replica, errReplicaEjected)
}

// rewrite points the outbound request at the attempt's replica and sets
// upstream auth (setCredentials): the replica's api key replaces every
// credential the client sent; without a key they pass only if configured.
func (p *Proxy) rewrite(pr *httputil.ProxyRequest) {
	a := attemptFrom(pr.In.Context())
	// The body was read whole: hand the transport an in-memory reader of a
	// known length (ReverseProxy's own wrapper hides that), so that the
	// request's headers and body leave in one write (one syscall, one packet when small), and GetBody
	// lets the transport resend it on a dead keep-alive connection. The
	// transport recognises io.NopCloser over a *bytes.Reader, not a type of
	// ours (TestRequestLeavesInOneWrite).
	if body := a.body; len(body.b) > 0 {
		a.first.Reset(body.b)
		a.sent = &a.first
		pr.Out.Body = io.NopCloser(a.sent)
		pr.Out.GetBody = func() (io.ReadCloser, error) {
			a.sent = bytes.NewReader(body.b)
			return io.NopCloser(a.sent), nil
		}
		pr.Out.ContentLength = int64(len(body.b))
	}
	pr.SetURL(a.target)
	pr.SetXForwarded()
	if via := pr.In.Header.Values(viaKey); len(via) > 0 {
		pr.Out.Header[viaKey] = []string{strings.Join(via, ", ") + ", " + p.id}
	} else {
		pr.Out.Header[viaKey] = p.via
	}
	setCredentials(pr.Out.Header, p.apiKey(a.res.Replica), p.cfg.PassAuthorization)
}

// credentialHeaders are the headers clients put an API key in: OpenAI's
// Authorization, Anthropic's x-api-key and Azure OpenAI's api-key.
var credentialHeaders = [...]string{"Authorization", "X-Api-Key", "Api-Key"}

// setCredentials applies a replica's api key to an outbound request's
// headers: with a key, no client credential goes on (Authorization carries
// the key, and so do x-api-key and api-key if the client sent them, for a
// replica that reads those); without one, the client's pass only when pass
// is set (proxy.pass_authorization).
func setCredentials(h http.Header, key string, pass bool) {
	switch {
	case key != "":
		for _, name := range credentialHeaders[1:] {
			if _, ok := h[name]; ok {
				h[name] = []string{key}
			}
		}
		h.Set("Authorization", "Bearer "+key)
	case !pass:
		for _, name := range credentialHeaders {
			h.Del(name)
		}
	}
}

// modifyResponse stamps the route headers and wraps the body to see its
// first byte, its end and a break. A 101 Switching Protocols answer
// (WebSocket, e.g. vLLM's /v1/realtime) keeps its body unwrapped:
// ReverseProxy needs it writable to join the two connections.
func (p *Proxy) modifyResponse(res *http.Response) error {
	a := attemptFrom(res.Request.Context())
	p.waiting.remove(a) // answered: an ejection no longer concerns it
	if p.cfg.RouteHeaders {
		// Both values in the attempt's own allocation; each slice is
		// capped so that an Add to one cannot overwrite the other.
		a.route = [2]string{a.res.Replica, string(a.res.Reason)}
		res.Header[replicaKey], res.Header[routeKey] = a.route[0:1:1], a.route[1:2:2]
		if q := a.res.Explanation.Queued; q > 0 {
			res.Header[queueWaitKey] = []string{queueWaitValue(q)}
		}
	}
	a.status = res.StatusCode
	if p.isOwnLoop(res) {
		p.noteLoop(a.res.Replica, a.res.URL)
		return errLoop
	}
	if (res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden) && p.apiKey(a.res.Replica) != "" {
		// The replica refused the key configured for it, not the
		// client's: its configuration is wrong, and another replica may
		// serve the request. The replica's own answer would tell the
		// client its key is bad.
		return fmt.Errorf("%w: %d %s", errReplicaAuth, res.StatusCode, http.StatusText(res.StatusCode))
	}
	if a.mayRetry && p.retryStatus[res.StatusCode] {
		return a.holdRefusal(res)
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		a.upgrade = true
		a.stopIdle() // a WebSocket may be silent as long as it likes
		return nil
	}
	ct := res.Header.Get("Content-Type")
	sse := strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
	if sse {
		a.tw.flushHeader = true
		a.startIdle() // also for streams the request did not announce
		// An error event may be appended: relay the stream chunked, never
		// with the replica's Content-Length, which would cut it off.
		res.ContentLength = -1
		res.Header.Del("Content-Length")
	} else {
		a.stopIdle() // a JSON answer arrives whole
	}
	a.releaseBody()
	a.ub = upstreamBody{
		rc:       res.Body,
		a:        a,
		p:        p,
		sse:      sse,
		wantDone: sse && a.wantDone && res.StatusCode == http.StatusOK,
		length:   res.ContentLength,
		trailer:  len(res.Trailer) > 0,
	}
	res.Body = &a.ub
	return nil
}

// errorHandler records a failure before any response: the retry decision is
// taken by route, so it writes nothing. A cancellation of the attempt by the
// proxy itself (idle timeout, ejection) is recorded as its cause.
func (p *Proxy) errorHandler(_ http.ResponseWriter, r *http.Request, err error) {
	a := attemptFrom(r.Context())
	if a.client.Err() == nil && a.ctx.Err() != nil {
		if cause := context.Cause(a.ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = cause
		}
	}
	a.err = err
}

type nopRecorder struct{}

func (nopRecorder) Request(string, balancer.Reason, int) {}
func (nopRecorder) FirstByte(string, time.Duration)      {}
func (nopRecorder) StreamError(string)                   {}
func (nopRecorder) Failover(string)                      {}
