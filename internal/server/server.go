// Package server wires `llmlb serve` together: the routing core, the proxy
// and admin listeners, the scraper and the 1 s health ticker, and owns their
// lifecycle. Run stops accepting on cancel, lets in-flight
// responses finish up to server.shutdown_timeout and returns nil.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/admin"
	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/health"
	"github.com/llmlb/llmlb/internal/modeltok"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/replicaurl"
	"github.com/llmlb/llmlb/internal/request"
	"github.com/llmlb/llmlb/internal/scrape"
	"github.com/llmlb/llmlb/internal/sharedstate"
	"github.com/llmlb/llmlb/internal/ui"
)

// Defaults applied when the corresponding config field is empty.
const (
	DefaultListen            = ":8080"
	DefaultAdminListen       = "127.0.0.1:9090"
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 120 * time.Second
	DefaultMaxConnections    = 10000
	// TickInterval is how often balancer.Tick runs (PROBING -> LIVE, pin expiry).
	TickInterval = time.Second
	// FlowInterval is how often flow control expires requests that waited
	// flow_control.max_queue_time and dispatches waiting ones to replicas
	// that got room without a request of this instance ending (a scrape
	// or a peer instance shows it too, at once).
	FlowInterval = 100 * time.Millisecond
)

// Option adjusts a Server (tests, the demo).
type Option func(*options)

type options struct {
	fetcher   scrape.Fetcher
	transport http.RoundTripper
	now       func() time.Time
	discovery discovery.Source
}

// WithFetcher replaces the HTTP metrics fetcher (e.g. scrape.Fake in tests).
func WithFetcher(f scrape.Fetcher) Option { return func(o *options) { o.fetcher = f } }

// WithTransport replaces the proxy's transport to the replicas.
func WithTransport(rt http.RoundTripper) Option { return func(o *options) { o.transport = rt } }

// WithClock replaces time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// Server is a running (or ready to run) `llmlb serve`.
type Server struct {
	cfg     config.Config
	log     *slog.Logger
	now     func() time.Time
	bal     *balancer.Balancer
	gate    *admission.Gate // flow control's queues in front of bal
	metrics *admin.Metrics
	proxy   *proxy.Proxy
	handler http.Handler // the proxy with request ids, access log and latency metrics, and /health
	admin   *admin.Handler
	scraper *scrape.Scraper
	dash    *ui.Dashboard
	reqCfg  request.Config // cfg.Request as the proxy parses with it (PromptBlocks set for the policies that need them)

	frontend Frontend // nil: the HTTP proxy serves the proxy listener

	discovery discovery.Source   // nil: static replicas only
	syncer    *discovery.Syncer  // applies discovery's sets
	shared    *sharedstate.Redis // nil: no shared state (state.redis_url unset)
	kv        *kvFeed            // replicas' KV cache events (kvevents.go)

	keysMu sync.RWMutex
	keys   map[string]string // replica name -> api key (never logged)

	reloadMu   sync.Mutex
	configured map[string]config.Replica // replicas from the config file, by name (Reload's baseline)

	proxyCert, adminCert *certSource // nil: cleartext listener

	mu               sync.Mutex
	proxyLn, adminLn net.Listener
	started          bool
	draining         atomic.Bool
}

// New builds a server from a validated configuration. It starts nothing:
// Listen binds the listeners, Run serves.
func New(cfg config.Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if o.now == nil {
		o.now = time.Now
	}
	bal, err := balancer.New(cfg.Routing)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	// Debug logs explain every decision, with each candidate's estimate.
	bal.SetExplain(logger.Enabled(context.Background(), slog.LevelDebug))
	// Flow control (docs/FLOW_CONTROL.md): one queue per model in front of
	// the core; the proxy admits, the server pumps, expires and drains.
	gate := admission.New(bal, cfg.FlowControl.Queue())
	s := &Server{
		cfg:     cfg,
		log:     logger,
		now:     o.now,
		bal:     bal,
		gate:    gate,
		metrics: admin.NewMetrics(bal, o.now),
		keys:    make(map[string]string),
		dash: ui.New(ui.Options{Balancer: bal, Token: cfg.AdminToken, OpenMutations: cfg.AdminToken == "" && cfg.Admin.AllowUnauthenticatedMutations,
			Queue: gate.Stats, Logger: logger, Now: o.now}),

		configured: make(map[string]config.Replica),
	}
	s.kv = newKVFeed(bal, logger, o.now)
	// Policies that match prompts by their block hashes (prefix-tree, llm-d,
	// cost) need the request parser to compute them (docs/POLICIES.md).
	if f, ok := policy.Lookup(cfg.Routing.Policy); ok && f.PromptBlocks {
		cfg.Request.PromptBlocks = true
	}
	if len(cfg.Tokenizers) > 0 {
		start := time.Now()
		toks, err := modeltok.LoadAll(cfg.Tokenizers)
		if err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
		cfg.Request.Tokenizer = toks.For
		// The replicas' KV cache events are keyed by the token ids they
		// carry, as the prompts of those models are now hashed.
		s.kv.feed.Index().SetKeyByTokens(true)
		logger.Info("server: loaded the models' tokenizers", slog.Int("models", toks.Len()), slog.Duration("took", time.Since(start)),
			slog.Any("renders", toks.Describe()))
	}
	s.reqCfg = cfg.Request
	if cfg.Server.TLS.Enabled() {
		if s.proxyCert, err = newCertSource("proxy", cfg.Server.TLS, logger); err != nil {
			return nil, err
		}
	}
	if cfg.Admin.TLS.Enabled() {
		if s.adminCert, err = newCertSource("admin", cfg.Admin.TLS, logger); err != nil {
			return nil, err
		}
	}
	s.proxy, err = proxy.New(proxy.Options{
		Balancer:  bal,
		Request:   cfg.Request,
		Proxy:     cfg.Proxy,
		APIKey:    s.apiKey,
		Transport: o.transport,
		Metrics:   recorders{s.metrics, s.dash},
		Decisions: func(at time.Time, res *balancer.Reservation, prof *request.Profile, attempt int) {
			s.dash.Decision(at, res, prof, attempt)
			s.metrics.Decision(at, res, prof, attempt)
		},
		Transitions: s.onTransitions,
		Logger:      logger,
		Now:         o.now,

		ReadBodyTimeout: cfg.Server.ReadBodyTimeout,

		Gate:             gate,
		TenantFromAPIKey: cfg.FlowControl.TenantFrom == config.TenantFromAPIKey,
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	s.metrics.RegisterQueue(gate)
	s.metrics.RegisterKVEvents(s.kv.feed)
	s.handler = &withHealth{next: &observed{next: s.proxy, metrics: s.metrics, bal: bal, log: logger, now: o.now, accessLog: cfg.Log.Access},
		bal: bal, now: o.now, draining: &s.draining}
	// Shared state (docs/SHARED_STATE.md): the core publishes its affinity
	// changes to Redis and applies its peers'; Run runs the client.
	if cfg.State.Enabled() {
		if s.shared, err = sharedstate.Attach(cfg.State, bal, s.metrics.Registry(), logger, o.now); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	adminAPI, err := admin.NewHandler(admin.Options{
		Balancer: bal,
		Fleet:    fleet{s},
		Metrics:  s.metrics,
		Token:    cfg.AdminToken,
		Draining: func() bool { return s.draining.Load() },
		Logger:   logger,
		Now:      o.now,

		Listen:                        orDefault(cfg.AdminListen, DefaultAdminListen),
		AllowedHosts:                  cfg.Admin.AllowedHosts,
		AllowUnauthenticatedMutations: cfg.Admin.AllowUnauthenticatedMutations,
	})
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	// The dashboard (GET /ui, GET /admin/events) beside the admin API,
	// behind its Host check.
	s.dash.Register(adminAPI)
	s.admin = adminAPI
	fetcher := o.fetcher
	if fetcher == nil {
		fetcher = scrape.NewHTTPFetcher(scrape.HTTPOptions{
			Timeout:      cfg.Scrape.Timeout,
			MaxBodyBytes: cfg.Scrape.MaxBodyBytes,
			HealthCheck:  cfg.Scrape.HealthCheck,
		})
	}
	s.scraper = scrape.New(fetcher, bal, scrape.Options{
		Interval:          cfg.Scrape.Interval,
		ModelsInterval:    cfg.Scrape.ModelsInterval,
		MaxModels:         cfg.Scrape.MaxModels,
		MaxModelNameBytes: cfg.Scrape.MaxModelNameBytes,
		OnModelsDropped:   s.metrics.ModelsDropped,
		OnTransitions:     s.onTransitions,
		OnScrape: func(name string, err error, _ time.Duration) {
			s.metrics.Scrape(name, err == nil)
			s.proxy.Pump() // the replica may have room now
		},
		OnResult: s.dash.ScrapeResult,
		Logger:   logger,
		Now:      o.now,
	})
	for _, r := range cfg.Replicas {
		spec := balancer.ReplicaSpec{Name: r.Name, URL: r.URL, Models: r.Models, KVCacheTokens: r.KVCacheTokens}
		if spec.Name == "" {
			spec.Name = defaultName(r.URL)
		}
		r.Metrics = s.metricsMode(r.Metrics)
		if err := s.addReplica(spec, r.APIKey, r.Metrics, kvSourceOf(r)); err != nil {
			return nil, err
		}
		r.Name = spec.Name
		s.configured[spec.Name] = r
	}
	s.discovery = o.discovery
	if s.discovery == nil {
		if s.discovery, err = discovery.New(cfg.Discovery, logger); err != nil {
			return nil, fmt.Errorf("server: %w", err)
		}
	}
	if s.discovery != nil {
		s.syncer = discovery.NewSyncer(discoveryFleet{s}, cfg.Discovery.APIKey, cfg.Discovery.DrainTimeout, logger)
	}
	return s, nil
}

// Reload applies a new replica list at run time (SIGHUP in `llmlb serve`):
// configured replicas missing from the list are removed (their in-flight
// responses finish; only new requests stop going there), new ones are
// added, and one whose URL, models, api key or metrics mode changed is
// replaced.
// Replicas added through the admin API are left alone. Other settings need
// a restart. It returns the names added and removed.
func (s *Server) Reload(replicas []config.Replica) (added, removed []string, err error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	// Compared by their effective metrics mode: writing out the default
	// (metrics: auto under scrape.metrics: auto) changes nothing.
	replicas = slices.Clone(replicas)
	for i := range replicas {
		replicas[i].Metrics = s.metricsMode(replicas[i].Metrics)
	}
	want := make(map[string]config.Replica, len(replicas))
	for _, r := range replicas {
		if r.Name == "" {
			r.Name = defaultName(r.URL)
		}
		want[r.Name] = r
	}
	for name, old := range s.configured {
		r, ok := want[name]
		if !ok || !sameReplica(old, r) {
			s.removeReplica(name)
			delete(s.configured, name)
			removed = append(removed, name)
			continue
		}
		// Only its KV event endpoints changed: subscribe there, keep the rest.
		if kvSourceOf(old) != kvSourceOf(r) {
			s.kv.set(name, kvSourceOf(r))
			s.configured[name] = r
		}
	}
	var errs []error
	for _, r := range replicas {
		if r.Name == "" {
			r.Name = defaultName(r.URL)
		}
		if _, ok := s.configured[r.Name]; ok {
			continue
		}
		if err := s.addReplica(balancer.ReplicaSpec{Name: r.Name, URL: r.URL, Models: r.Models, KVCacheTokens: r.KVCacheTokens}, r.APIKey, r.Metrics, kvSourceOf(r)); err != nil {
			errs = append(errs, err)
			continue
		}
		s.configured[r.Name] = r
		added = append(added, r.Name)
	}
	return added, removed, errors.Join(errs...)
}

// sameReplica reports whether a reload keeps replica a as b (its KV event
// endpoints may change without replacing it).
func sameReplica(a, b config.Replica) bool {
	return a.URL == b.URL && a.APIKey == b.APIKey && slices.Equal(a.Models, b.Models) && a.Metrics == b.Metrics
}

// kvSourceOf is where a configured replica publishes its KV cache events.
func kvSourceOf(r config.Replica) kvSource {
	return kvSource{endpoint: r.KVEvents, replay: r.KVEventsReplay}
}

// defaultName is a replica's name when none is configured: host:port.
func defaultName(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return raw
}

// ReloadRouting applies a reloaded configuration's routing section to the
// running core (balancer.Reconfigure): everything but the policy and the
// seed, which need a restart and are refused with an error. Waiting
// requests may fit the new saturation settings: they are pumped.
func (s *Server) ReloadRouting(cfg config.Config) error {
	err := s.bal.Reconfigure(cfg.Routing)
	s.proxy.Pump()
	return err
}

// ReloadFlowControl refuses a reloaded configuration whose flow_control
// differs from the running one: the queues hold their tenants, fair shares
// and limits, so the section is read at start only.
func (s *Server) ReloadFlowControl(cfg config.Config) error {
	if reflect.DeepEqual(s.cfg.FlowControl, cfg.FlowControl) {
		return nil
	}
	return errors.New("server: flow_control changed; it needs a restart (the queues keep their tenants and limits), the running settings stay")
}

// Frontend serves the proxy listener in place of the HTTP proxy: `llmlb
// epp` serves the Endpoint Picker's gRPC there on the same routing core.
type Frontend interface {
	// Serve serves ln until Shutdown; it returns nil after Shutdown.
	Serve(ln net.Listener) error
	// Shutdown stops accepting and waits for the open exchanges to end;
	// when ctx ends first it closes them and returns ctx's error.
	Shutdown(ctx context.Context) error
}

// UseFrontend makes Run serve f on the proxy listener instead of the HTTP
// proxy; everything else (admin listener, scraper, health ticker,
// discovery, drain) is as for `llmlb serve`. Call it before Run.
func (s *Server) UseFrontend(f Frontend) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.frontend = f
}

// RequestConfig is the request parsing configuration the proxy uses (with
// prompt block hashes on for the policies that match prompts by them).
func (s *Server) RequestConfig() request.Config { return s.reqCfg }

// Recorder returns what the proxy records its measurements into (the
// Prometheus metrics and the dashboard).
func (s *Server) Recorder() proxy.Recorder { return recorders{s.metrics, s.dash} }

// Transitions logs and counts health transitions caused outside the
// server's own loops (a frontend's Release), once each, as serve does.
func (s *Server) Transitions(ts []balancer.Transition) {
	if len(ts) > 0 {
		s.onTransitions(ts)
	}
}

// Logger returns the server's logger.
func (s *Server) Logger() *slog.Logger { return s.log }

// Config returns the configuration the server was built with.
func (s *Server) Config() config.Config { return s.cfg }

// Balancer returns the routing core (for the demo's summary and tests).
func (s *Server) Balancer() *balancer.Balancer { return s.bal }

// Gate returns flow control's queues (tests, the demo).
func (s *Server) Gate() *admission.Gate { return s.gate }

// Dashboard returns the live dashboard (the demo's screen reads its snapshots).
func (s *Server) Dashboard() *ui.Dashboard { return s.dash }

// Metrics returns llmlb's own metrics.
func (s *Server) Metrics() *admin.Metrics { return s.metrics }

// ProxyHandler returns the proxy listener's handler.
func (s *Server) ProxyHandler() http.Handler { return s.handler }

// AdminHandler returns the admin listener's handler.
func (s *Server) AdminHandler() http.Handler { return s.admin }

// SetAdminAccess applies the admin token, allowed hosts and the
// unauthenticated opt-in of a reloaded configuration to the next admin
// request (SIGHUP; docs/SECURITY.md: a token added by reload was ignored).
func (s *Server) SetAdminAccess(cfg config.Config) {
	s.admin.SetAccess(admin.Access{Token: cfg.AdminToken, AllowedHosts: cfg.Admin.AllowedHosts,
		AllowUnauthenticatedMutations: cfg.Admin.AllowUnauthenticatedMutations})
	s.dash.SetAccess(cfg.AdminToken, cfg.AdminToken == "" && cfg.Admin.AllowUnauthenticatedMutations)
}

// ReloadCertificates re-reads the TLS certificate and key files of the
// listeners that have them (SIGHUP); a pair that does not load is logged
// and the current one kept. Open connections are not dropped.
func (s *Server) ReloadCertificates() {
	for _, c := range []*certSource{s.proxyCert, s.adminCert} {
		if c != nil {
			c.Reload(false)
		}
	}
}

// UseListeners makes Run serve on the given listeners instead of binding
// cfg.Listen and cfg.AdminListen. Run closes them.
func (s *Server) UseListeners(proxyLn, adminLn net.Listener) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.proxyLn, s.adminLn = proxyLn, adminLn
}

// Listen binds the proxy and admin listeners (Run calls it when needed);
// after it ProxyAddr and AdminAddr are known, also for ":0" addresses.
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proxyLn == nil {
		ln, err := net.Listen("tcp", orDefault(s.cfg.Listen, DefaultListen))
		if err != nil {
			return fmt.Errorf("server: proxy listener: %w", err)
		}
		s.proxyLn = ln
	}
	if s.adminLn == nil {
		ln, err := net.Listen("tcp", orDefault(s.cfg.AdminListen, DefaultAdminListen))
		if err != nil {
			return fmt.Errorf("server: admin listener: %w", err)
		}
		s.adminLn = ln
	}
	return nil
}

// ProxyAddr is the proxy listener's bound address ("" before Listen).
func (s *Server) ProxyAddr() string { return s.addr(&s.proxyLn) }

// AdminAddr is the admin listener's bound address ("" before Listen).
func (s *Server) AdminAddr() string { return s.addr(&s.adminLn) }

func (s *Server) addr(ln *net.Listener) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if *ln == nil {
		return ""
	}
	return (*ln).Addr().String()
}

// Run serves until ctx is cancelled, then drains: it stops accepting, lets
// in-flight responses (long streams included) finish up to
// server.shutdown_timeout, closes what remains and returns nil. It returns
// an error if a listener fails. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return errors.New("server: Run called twice")
	}
	s.started = true
	s.mu.Unlock()
	if err := s.Listen(); err != nil {
		return err
	}
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)
	newHTTP := func(h http.Handler) *http.Server {
		// No WriteTimeout: it would cut long streams.
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: orDefault(s.cfg.Server.ReadHeaderTimeout, DefaultReadHeaderTimeout),
			IdleTimeout:       orDefault(s.cfg.Server.IdleTimeout, DefaultIdleTimeout),
			ErrorLog:          errLog,
		}
	}
	proxySrv, adminSrv := newHTTP(s.handler), newHTTP(s.admin)
	if s.proxyCert != nil {
		proxySrv.TLSConfig = s.proxyCert.TLSConfig()
	} else if s.cfg.Server.H2c {
		// HTTP/1.1 as before, and HTTP/2 to clients that open with its preface.
		proxySrv.Protocols = new(http.Protocols)
		proxySrv.Protocols.SetHTTP1(true)
		proxySrv.Protocols.SetUnencryptedHTTP2(true)
	}
	if s.adminCert != nil {
		adminSrv.TLSConfig = s.adminCert.TLSConfig()
	}
	// Event streams are never idle: end them when the admin listener shuts down.
	adminSrv.RegisterOnShutdown(s.dash.Close)

	bgCtx, stopBG := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Add(5)
	bg.Go(func() { s.kv.run(bgCtx) })
	if s.shared != nil {
		bg.Add(1)
		go func() {
			defer bg.Done()
			if err := s.shared.Run(bgCtx); err != nil {
				s.log.Error("server: shared state stopped", slog.String("error", err.Error()))
			}
		}()
		s.log.Info("shared state on", slog.String("instance", s.shared.ID()))
	}
	go func() {
		defer bg.Done()
		if err := s.scraper.Run(bgCtx); err != nil && !errors.Is(err, context.Canceled) {
			s.log.Error("server: scraper stopped", slog.String("error", err.Error()))
		}
	}()
	go func() {
		defer bg.Done()
		s.tick(bgCtx)
	}()
	go func() {
		defer bg.Done()
		s.dash.Run(bgCtx)
	}()
	go func() {
		defer bg.Done()
		s.runDiscovery(bgCtx)
	}()
	go func() {
		defer bg.Done()
		s.flowTick(bgCtx)
	}()
	for _, c := range []*certSource{s.proxyCert, s.adminCert} {
		if c != nil {
			bg.Add(1)
			go func() {
				defer bg.Done()
				c.watch(bgCtx, CertCheckInterval)
			}()
		}
	}

	serveErr := make(chan error, 2)
	serve := func(srv *http.Server, ln net.Listener, what string) {
		var err error
		if srv.TLSConfig != nil {
			// The certificate comes from TLSConfig.GetCertificate.
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			serveErr <- fmt.Errorf("server: %s listener: %w", what, err)
		}
	}
	s.mu.Lock()
	frontend := s.frontend
	s.mu.Unlock()
	if frontend != nil && s.proxyCert != nil {
		stopBG()
		bg.Wait()
		return errors.New("server: server.tls serves the HTTP proxy only; the gRPC listener of llmlb epp takes no certificate (terminate TLS in the gateway in front of it)")
	}
	if frontend != nil {
		ln := s.limitedProxyListener()
		go func() {
			if err := frontend.Serve(ln); err != nil {
				serveErr <- fmt.Errorf("server: grpc listener: %w", err)
			}
		}()
	} else {
		go serve(proxySrv, s.limitedProxyListener(), "proxy")
	}
	go serve(adminSrv, s.adminLn, "admin")
	if frontend != nil {
		s.log.Info("llmlb serving", slog.String("grpc", s.ProxyAddr()), slog.String("admin", s.AdminAddr()))
	} else {
		s.log.Info("llmlb serving", slog.String("proxy", s.ProxyAddr()), slog.String("admin", s.AdminAddr()))
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
	}

	// Drain: stop accepting proxy connections and wait for in-flight
	// responses. The admin listener stays up meanwhile (readyz says
	// "draining", /admin/replicas shows the in-flight count going down).
	// server.shutdown_timeout 0 means no drain: connections close at once.
	s.draining.Store(true)
	timeout := s.cfg.Server.ShutdownTimeout
	s.log.Info("llmlb draining", slog.Duration("deadline", timeout), slog.Int("queued", s.gate.Len()))
	// Requests waiting in flow control's queues go to a replica with room
	// or get 503 now: none waits for the deadline, none is lost.
	s.proxy.Shutdown()
	shCtx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	shutdown := func(srv *http.Server, what string) {
		if err := srv.Shutdown(shCtx); err != nil {
			s.log.Warn("server: drain deadline passed, closing remaining connections",
				slog.String("listener", what), slog.String("error", err.Error()))
			_ = srv.Close()
		}
	}
	if frontend != nil {
		if err := frontend.Shutdown(shCtx); err != nil {
			s.log.Warn("server: drain deadline passed, closing remaining connections",
				slog.String("listener", "grpc"), slog.String("error", err.Error()))
		}
	} else {
		shutdown(proxySrv, "proxy")
	}
	shutdown(adminSrv, "admin")
	stopBG()
	bg.Wait()
	s.log.Info("llmlb stopped")
	return runErr
}

// limitedProxyListener caps the proxy listener's open connections at
// server.max_connections, lowered to fit the open-file limit (docs/SECURITY.md,
// "File-descriptor exhaustion": 21,000 idle connections exhausted the file descriptors and
// stopped the admin listener too).
func (s *Server) limitedProxyListener() net.Listener {
	limit := orDefault(s.cfg.Server.MaxConnections, DefaultMaxConnections)
	if fit := fdBudget(); fit > 0 && fit < limit {
		s.log.Warn("server: server.max_connections lowered to fit the open-file limit",
			slog.Int("configured", limit), slog.Int("max_connections", fit))
		limit = fit
	}
	return LimitListener(s.proxyLn, limit)
}

// tick drives the core's time-based transitions once a second.
func (s *Server) tick(ctx context.Context) {
	t := time.NewTicker(TickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if ts := s.bal.Tick(s.now()); len(ts) > 0 {
				s.onTransitions(ts)
			}
		}
	}
}

// flowTick expires requests that waited flow_control.max_queue_time and
// dispatches waiting ones every FlowInterval until ctx ends.
func (s *Server) flowTick(ctx context.Context) {
	t := time.NewTicker(FlowInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.proxy.Expire()
			s.proxy.Pump()
		}
	}
}

// onTransitions logs every health transition once, at info, and counts it.
// Waiting requests are pumped: a replica back to LIVE may take them.
func (s *Server) onTransitions(ts []balancer.Transition) {
	defer s.proxy.Pump()
	s.metrics.Transitions(ts)
	s.dash.Transitions(ts)
	for _, t := range ts {
		if t.To == health.Ejected && s.proxy != nil {
			s.proxy.Ejected(t.Replica) // its waiting requests fail over now
		}
		attrs := []slog.Attr{
			slog.String("replica", t.Replica),
			slog.String("from", t.From.String()),
			slog.String("to", t.To.String()),
			slog.String("cause", t.Cause),
		}
		if t.Cooldown > 0 {
			attrs = append(attrs, slog.Duration("cooldown", t.Cooldown))
		}
		s.log.LogAttrs(context.Background(), slog.LevelInfo, "replica state changed", attrs...)
	}
}

func (s *Server) apiKey(replica string) string {
	s.keysMu.RLock()
	defer s.keysMu.RUnlock()
	return s.keys[replica]
}

// addReplica adds a replica to the core and the scraper (with its api key,
// scraped as metrics says: config.MetricsAuto or MetricsNone, "" for
// scrape.metrics). It starts not yet ready: no traffic until its
// first good scrape, and no flap cooldown while it is still coming up, so a
// balancer started before its replicas (or a replica added by API that does
// not exist) never shows a dead replica LIVE.
func (s *Server) addReplica(spec balancer.ReplicaSpec, apiKey, metrics string, kv kvSource) error {
	metrics = s.metricsMode(metrics)
	spec.NotReady = true
	if err := s.bal.AddReplica(spec, s.now()); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	err := s.scraper.Add(scrape.Target{Name: spec.Name, URL: spec.URL, APIKey: apiKey, Models: spec.Models,
		LivenessOnly: metrics == config.MetricsNone})
	if err != nil {
		s.bal.RemoveReplica(spec.Name, s.now())
		return fmt.Errorf("server: %w", err)
	}
	s.keysMu.Lock()
	s.keys[spec.Name] = apiKey
	s.keysMu.Unlock()
	s.metrics.InitReplica(spec.Name)
	s.kv.set(spec.Name, kv)
	s.proxy.Pump()
	return nil
}

// metricsMode is a replica's effective metrics setting: its own (m), else
// scrape.metrics, else config.MetricsAuto.
func (s *Server) metricsMode(m string) string {
	if m != "" {
		return m
	}
	if s.cfg.Scrape.Metrics != "" {
		return s.cfg.Scrape.Metrics
	}
	return config.MetricsAuto
}

// checkNotSelf refuses a replica URL that reaches one of this server's own
// listeners (configured or bound): every request sent there would loop.
// The caller holds reloadMu (s.cfg).
func (s *Server) checkNotSelf(raw string) error {
	var ls []string
	for _, a := range []string{s.cfg.Listen, s.cfg.AdminListen, s.ProxyAddr(), s.AdminAddr()} {
		if a != "" {
			ls = append(ls, a)
		}
	}
	if l, self := replicaurl.PointsAt(raw, ls, replicaurl.LocalResolver{}); self {
		return fmt.Errorf("server: %q is llmlb's own listener %q: every request sent there would come back", replicaurl.Redact(raw), l)
	}
	return nil
}

// fleet implements admin.Fleet on the server.
type fleet struct{ s *Server }

// AddReplica adds a replica at run time (no api key: the client's
// Authorization passes as configured; scraped as scrape.metrics says),
// subscribed to its KV cache events when it publishes them.
func (f fleet) AddReplica(spec balancer.ReplicaSpec, ev admin.KVEvents) error {
	f.s.reloadMu.Lock()
	defer f.s.reloadMu.Unlock()
	if err := f.s.checkNotSelf(spec.URL); err != nil {
		return err
	}
	return f.s.addReplica(spec, "", "", kvSource{endpoint: ev.Endpoint, replay: ev.Replay})
}

// RemoveReplica stops scraping a replica and removes it from the core. A
// configured replica removed this way is forgotten by Reload too, so the
// next SIGHUP adds it back if the file still lists it.
func (f fleet) RemoveReplica(name string) bool {
	f.s.reloadMu.Lock()
	defer f.s.reloadMu.Unlock()
	delete(f.s.configured, name)
	return f.s.removeReplica(name)
}

// removeReplica stops scraping a replica and removes it from the core; its
// in-flight responses finish and release normally.
func (s *Server) removeReplica(name string) bool {
	scraped := s.scraper.Remove(name)
	// Its events stop first: once the core no longer lists the replica,
	// nothing of it is left in the KV index or subscribed to.
	s.kv.remove(name)
	removed := s.bal.RemoveReplica(name, s.now())
	s.keysMu.Lock()
	delete(s.keys, name)
	s.keysMu.Unlock()
	s.metrics.ForgetReplica(name)
	// Requests waiting for its model stay queued for the other replicas;
	// with none left they are answered as without flow control.
	s.proxy.Pump()
	return scraped || removed
}

// SetDraining stops or resumes new traffic to a replica.
func (f fleet) SetDraining(name string, draining bool) bool {
	ok := f.s.bal.SetDraining(name, draining)
	f.s.proxy.Pump()
	return ok
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
