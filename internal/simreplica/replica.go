// Package simreplica serves a simulated vLLM replica over HTTP: the
// OpenAI-compatible endpoints, /health, /version and vLLM's /metrics, backed
// by one engine.Engine driven on the wall clock, plus run-time fault
// injection (refuse, hang, 5xx, slow, broken streams, flapping). Tests, the
// demo and `llmlb sim` start replicas in process with New+Run or StartFleet.
package simreplica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/llmlb/llmlb/internal/engine"
)

// Options configure one replica. Zero values take the defaults noted.
type Options struct {
	Name    string // shown in logs; default "sim"
	Model   string // the served model id; default "sim-model"
	Profile string // engine profile; default engine.DefaultProfile
	// Listen is the address of the OpenAI/metrics listener; default "127.0.0.1:0".
	Listen string
	// ControlListen, if set, is a second listener serving only /sim/fault, so
	// that scripts can switch faults while the main listener refuses or hangs.
	ControlListen string
	// LegacyMetrics emits the pre-0.12 vLLM names (vllm:gpu_cache_usage_perc,
	// vllm:gpu_prefix_cache_queries_total, vllm:gpu_prefix_cache_hits_total).
	LegacyMetrics bool
	// Fault is the fault the replica starts in (default none).
	Fault Fault
	// DefaultMaxTokens is the output length when a request sets no max_tokens;
	// default 256 (such requests finish with reason "stop").
	DefaultMaxTokens int
	// MaxBodyBytes limits request bodies; default 32 MiB.
	MaxBodyBytes int64
	// Seed seeds the error-rate fault's random draws; 0 picks one at random.
	Seed uint64
	// MaxNumSeqs and KVCacheTokens, when > 0, override the profile's running
	// slots and KV-cache size (load runs need thousands of slots).
	MaxNumSeqs, KVCacheTokens int
	// MaxPartialPrefills, when > 0, overrides the profile's prefill model:
	// 1 serial, more runs that many prefills in parallel
	// (engine.Profile.MaxPartialPrefills).
	MaxPartialPrefills int
	// PriorityScheduling orders the engine's waiting queue by the requests'
	// priority field (vLLM's --scheduling-policy priority); without it a
	// non-zero priority is refused, as vLLM does.
	PriorityScheduling bool
	// Tokenizer, if set, tokenizes prompts as an engine serving the model
	// does (package modeltok): blocks are then hashed as vLLM hashes them,
	// from HashSeed (random when ""), and KV cache events carry the token
	// ids of the blocks they store. Without it the replica uses the
	// pseudo-tokenizer and llmlb's own block hashes (package tokenize).
	Tokenizer Tokenizer
	HashSeed  string
	// Logger receives lifecycle and fault messages; default slog.Default().
	Logger *slog.Logger
}

const (
	defaultModel        = "sim-model"
	defaultMaxTokens    = 256
	defaultMaxBodyBytes = 32 << 20
	shutdownGrace       = 2 * time.Second
	relistenRetry       = 100 * time.Millisecond
)

// Replica is one simulated vLLM server. Create it with New (which binds the
// listeners, so URL is known at once) and run it with Run.
type Replica struct {
	name, model string
	opts        Options
	log         *slog.Logger
	gate        *gateListener
	control     net.Listener // nil without ControlListen
	created     int64        // unix seconds, for /v1/models
	nextID      atomic.Uint64
	wake        chan struct{} // cap 1: a request arrived or the fault changed
	stopped     chan struct{} // closed when Run begins to shut down
	metrics     http.Handler
	profile     engine.Profile
	toks        *engineTokens // nil without Options.Tokenizer

	mu         sync.Mutex // guards everything below and the engine
	eng        *engine.Engine
	pending    map[uint64]*reqState
	finished   [len(finishReasons)]uint64 // request_success_total by reason
	fault      Fault
	slowdown   float64 // the factor last given to the engine
	faultSince time.Time
	rng        *rand.Rand
	conns      map[net.Conn]struct{} // open connections on the main listener
	running    bool                  // Run was called
}

// reqState is one in-flight request as the engine loop reports it. It is
// guarded by Replica.mu; notify (cap 1) tells the handler to look again, so a
// slow consumer is never waited for: it finds several tokens at once.
type reqState struct {
	stop      bool // finish reason "stop" (max_tokens absent) rather than "length"
	firstDone bool
	tokens    int // output tokens generated so far
	cached    int
	done      bool
	aborted   bool
	notify    chan struct{}
}

// New validates opts, builds the engine and binds the listeners. Call Run to
// serve; New starts no goroutines.
func New(opts Options) (*Replica, error) {
	if opts.Name == "" {
		opts.Name = "sim"
	}
	if opts.Model == "" {
		opts.Model = defaultModel
	}
	if opts.Profile == "" {
		opts.Profile = engine.DefaultProfile
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.DefaultMaxTokens <= 0 {
		opts.DefaultMaxTokens = defaultMaxTokens
	}
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = defaultMaxBodyBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	fault, err := opts.Fault.Normalize()
	if err != nil {
		return nil, err
	}
	profile, err := engine.Lookup(opts.Profile)
	if err != nil {
		return nil, fmt.Errorf("simreplica: %w", err)
	}
	if opts.MaxNumSeqs > 0 {
		profile.MaxNumSeqs = opts.MaxNumSeqs
	}
	if opts.KVCacheTokens > 0 {
		profile.KVCacheTokens = opts.KVCacheTokens
	}
	if opts.MaxPartialPrefills > 0 {
		profile.MaxPartialPrefills = opts.MaxPartialPrefills
	}
	profile.PriorityScheduling = profile.PriorityScheduling || opts.PriorityScheduling
	if err := profile.Validate(); err != nil {
		return nil, fmt.Errorf("simreplica: %w", err)
	}
	seed := opts.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	gate, err := listenGate(opts.Listen)
	if err != nil {
		return nil, err
	}
	var control net.Listener
	if opts.ControlListen != "" {
		control, err = net.Listen("tcp", opts.ControlListen)
		if err != nil {
			gate.Close()
			return nil, fmt.Errorf("simreplica: control listen %s: %w", opts.ControlListen, err)
		}
	}
	r := &Replica{
		name:    opts.Name,
		model:   opts.Model,
		opts:    opts,
		log:     opts.Logger.With("replica", opts.Name),
		gate:    gate,
		control: control,
		created: time.Now().Unix(),
		wake:    make(chan struct{}, 1),
		stopped: make(chan struct{}),
		eng:     engine.New(profile),
		profile: profile,
		pending: make(map[uint64]*reqState),
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		conns:   make(map[net.Conn]struct{}),
	}
	if opts.Tokenizer != nil {
		r.toks = newEngineTokens(opts.Tokenizer, opts.HashSeed)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(r, opts.LegacyMetrics))
	r.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(r.log.Handler(), slog.LevelWarn)})
	r.mu.Lock()
	r.setFaultLocked(fault, time.Now())
	r.mu.Unlock()
	return r, nil
}

// Name returns the replica's name.
func (r *Replica) Name() string { return r.name }

// Model returns the served model id.
func (r *Replica) Model() string { return r.model }

// Addr returns the main listener's address (valid while refusing, too).
func (r *Replica) Addr() string { return r.gate.Addr().String() }

// URL returns the replica's base URL, e.g. "http://127.0.0.1:8001".
func (r *Replica) URL() string { return "http://" + r.Addr() }

// ControlURL returns the base URL of the control listener ("" without one).
func (r *Replica) ControlURL() string {
	if r.control == nil {
		return ""
	}
	return "http://" + r.control.Addr().String()
}

// Fault returns the current fault.
func (r *Replica) Fault() Fault {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fault
}

// SetFault switches the replica into f (Recover or None heal it). It takes
// effect before it returns: after SetFault(Fault{Mode: Refuse}) a dial fails.
func (r *Replica) SetFault(f Fault) error {
	f, err := f.Normalize()
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.setFaultLocked(f, time.Now())
	r.mu.Unlock()
	r.log.Info("simreplica: fault set", "fault", f.String())
	r.poke()
	return nil
}

// Slowdown returns the step-time factor the engine runs with (1 unless slow).
func (r *Replica) Slowdown() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.slowdown
}

// Refusing reports whether the main listener is closed right now.
func (r *Replica) Refusing() bool { return !r.gate.isUp() }

// Stats returns the engine's counters as of now.
func (r *Replica) Stats() engine.Stats {
	st, _ := r.snapshot()
	return st
}

// snapshot advances the engine to now and returns its stats and the
// request_success_total counters.
func (r *Replica) snapshot() (engine.Stats, [len(finishReasons)]uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.eng.Advance(time.Now(), r.deliver)
	return r.eng.Stats(), r.finished
}

func (r *Replica) setFaultLocked(f Fault, now time.Time) {
	r.fault, r.faultSince = f, now
	slow := 1.0
	if f.Mode == Slow {
		slow = f.Factor
	}
	// Steps already run keep their time; only later steps are slower.
	r.eng.Advance(now, r.deliver)
	r.eng.SetSlowdown(slow)
	r.slowdown = slow
	r.applyListenerLocked(now)
}

// applyListenerLocked opens or closes the main listener as the fault wants at
// now. Going down also closes every open connection, as a dead process would.
func (r *Replica) applyListenerLocked(now time.Time) {
	want := !r.fault.refusing(r.faultSince, now)
	if want == r.gate.isUp() {
		return
	}
	r.log.Debug("simreplica: listener", "up", want, "fault", r.fault.String())
	if !want {
		r.gate.down()
		for c := range r.conns {
			c.Close()
		}
		return
	}
	if err := r.gate.up(); err != nil {
		r.log.Warn("simreplica: cannot listen again; retrying", "err", err)
	}
}

// poke wakes the engine loop without blocking.
func (r *Replica) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// deliver is the engine's emit callback; it runs under r.mu.
func (r *Replica) deliver(ev engine.Event) {
	st, ok := r.pending[ev.ID]
	if !ok {
		return
	}
	switch ev.Kind {
	case engine.FirstToken:
		st.firstDone = true
		st.cached = ev.CachedTokens
	case engine.Finished:
		st.firstDone = true
		st.done = true
		st.cached = ev.CachedTokens
		delete(r.pending, ev.ID)
		if st.stop {
			r.finished[0]++
		} else {
			r.finished[1]++
		}
	case engine.Aborted:
		st.aborted = true
		delete(r.pending, ev.ID)
	}
	st.tokens = max(st.tokens, ev.OutputTokens)
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

// submit queues a request in the engine and returns its id and state.
func (r *Replica) submit(req engine.Request, stop bool) (uint64, *reqState, error) {
	id := r.nextID.Add(1)
	req.ID = id
	st := &reqState{stop: stop, notify: make(chan struct{}, 1)}
	r.mu.Lock()
	now := time.Now()
	r.eng.Advance(now, r.deliver)
	if err := r.eng.Add(req, now); err != nil {
		r.mu.Unlock()
		return 0, nil, err
	}
	r.pending[id] = st
	r.mu.Unlock()
	r.poke()
	return id, st, nil
}

// cancel aborts a request that has not finished (client gone, stream cut).
func (r *Replica) cancel(id uint64) {
	r.mu.Lock()
	st, ok := r.pending[id]
	if ok {
		delete(r.pending, id)
		r.eng.Abort(id, time.Now())
		r.finished[2]++
		st.aborted = true
	}
	r.mu.Unlock()
	if ok {
		r.poke()
	}
}

// read returns a copy of a request's state.
func (r *Replica) read(st *reqState) reqState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return reqState{stop: st.stop, firstDone: st.firstDone, tokens: st.tokens, cached: st.cached, done: st.done, aborted: st.aborted}
}

// Run serves HTTP and drives the engine until ctx is cancelled, then stops
// the servers, aborts what is in flight and releases the listeners. It
// returns nil after a clean stop. Run may be called once.
func (r *Replica) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.running {
		r.mu.Unlock()
		return errors.New("simreplica: Run called twice")
	}
	r.running = true
	r.mu.Unlock()

	errLog := slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)
	srv := &http.Server{
		Handler:           r.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          errLog,
		ConnState:         r.trackConn,
	}
	var ctrl *http.Server
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	r.gate.start()
	wg.Go(func() {
		if err := srv.Serve(r.gate); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			errc <- fmt.Errorf("simreplica: serve: %w", err)
		}
	})
	if r.control != nil {
		ctrl = &http.Server{Handler: r.controlHandler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: errLog}
		wg.Go(func() {
			if err := ctrl.Serve(r.control); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("simreplica: control serve: %w", err)
			}
		})
	}
	r.log.Debug("simreplica: serving", "url", r.URL(), "control", r.ControlURL(), "model", r.model)

	r.loop(ctx)

	close(r.stopped)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if ctrl != nil {
		if err := ctrl.Shutdown(sctx); err != nil {
			ctrl.Close()
		}
	}
	r.gate.Close()
	wg.Wait()
	r.mu.Lock()
	for id := range r.pending {
		r.eng.Abort(id, time.Now())
		delete(r.pending, id)
	}
	r.mu.Unlock()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// loop is the engine driver: advance to now, deliver events, then sleep until
// the next engine event, the next flap transition, or a wake-up.
func (r *Replica) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r.mu.Lock()
		now := time.Now()
		r.eng.Advance(now, r.deliver)
		r.applyListenerLocked(now)
		next, ok := r.eng.NextEvent()
		if t, fok := r.fault.nextChange(r.faultSince, now); fok && (!ok || t.Before(next)) {
			next, ok = t, true
		}
		if r.fault.refusing(r.faultSince, now) == r.gate.isUp() {
			// A failed re-listen: try again soon.
			t := now.Add(relistenRetry)
			if !ok || t.Before(next) {
				next, ok = t, true
			}
		}
		r.mu.Unlock()

		wait := time.Hour
		if ok {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// trackConn records open connections so that refusing can close them.
func (r *Replica) trackConn(c net.Conn, s http.ConnState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch s {
	case http.StateNew:
		if !r.gate.isUp() {
			// Accepted just before the socket went down: it dies with it.
			c.Close()
			return
		}
		r.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(r.conns, c)
	}
}

// drawError reports whether this request fails under the error fault, and
// with which status.
func (r *Replica) drawError() (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fault.Mode != Error {
		return 0, false
	}
	if r.fault.Rate < 1 && r.rng.Float64() >= r.fault.Rate {
		return 0, false
	}
	return r.fault.Status, true
}
