package admin

import (
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/kvindex"
	"github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/version"
)

// Metrics holds llmlb's own Prometheus metrics (prefix llmlb_). Events
// (requests, first bytes, stream errors, failovers, transitions, scrapes)
// are counted as they happen; the balancer's state (in-flight, effective
// load, replica state, pins, spills, rebinds, ejections) is read from the
// core at collection time, so it is never stale and costs nothing between
// scrapes. Metrics implements proxy.Recorder.
type Metrics struct {
	reg *prometheus.Registry

	requests    *prometheus.CounterVec
	firstByte   *prometheus.HistogramVec
	streamErrs  *prometheus.CounterVec
	failovers   *prometheus.CounterVec
	transitions *prometheus.CounterVec
	scrapes     *prometheus.CounterVec
	reloads     *prometheus.CounterVec
	dropped     *prometheus.GaugeVec

	// Client-facing latency and tokens by model and route reason; a model
	// label takes only the fleet's known models (others count as "other").
	ttft     *prometheus.HistogramVec
	duration *prometheus.HistogramVec
	tokens   *prometheus.CounterVec
	// tokenizerChecks compares the model tokenizer's prompt counts with
	// the engines' (TokenizerCheck).
	tokenizerChecks *prometheus.CounterVec
	bal             *balancer.Balancer
	known           sync.Map // model name -> true: its series exist
	modelsMu        sync.Mutex
	nModels         int // models in known, at most MaxModelSeries (under modelsMu)
	now             func() time.Time

	// queueWait is flow control's waits by priority (flowmetrics.go).
	queueWait *prometheus.HistogramVec
	// decided is what routing decisions expected (decisions.go).
	decided decisionMetrics
	// cache holds the children the per-request events count into
	// (children.go).
	cache seriesCache
}

// Route reasons and token kinds the client-facing series are created for
// up front, so they exist before the first request.
var (
	routeReasons = []string{string(balancer.ReasonAffinity), string(balancer.ReasonLoad), string(balancer.ReasonFallback)}
	tokenKinds   = []string{"prompt", "cached", "completion"}
)

// OtherModel is the model label of requests for a model no replica is
// known to serve (it keeps the label's values bounded).
const OtherModel = "other"

// MaxModelSeries caps the models that get their own latency and token
// series: a replica may advertise any number of models on /v1/models, and
// each one costs about 70 series. The first models in sorted order get
// series; the rest count as OtherModel, and so does a name longer than
// MaxModelLabelBytes. With both, /metrics stays under 2 MB whatever the
// replicas advertise.
const MaxModelSeries = 64

// MaxModelLabelBytes is the longest model name used as a label value.
const MaxModelLabelBytes = 128

// NewMetrics returns the metrics on a fresh registry (with the Go and
// process collectors); bal's state is collected at scrape time with now.
func NewMetrics(bal *balancer.Balancer, now func() time.Time) *Metrics {
	if now == nil {
		now = time.Now
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_requests_total",
			Help: "Client requests answered, by replica, route reason and HTTP status (replica empty: answered by the balancer).",
		}, []string{"replica", "reason", "code"}),
		firstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_time_to_first_byte_seconds",
			Help:    "Time from replica selection to the first response body byte.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 18), // 5 ms .. ~11 min
		}, []string{"replica"}),
		streamErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_stream_errors_total",
			Help: "Responses broken by the replica after their first byte (not retried).",
		}, []string{"replica"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_failovers_total",
			Help: "Attempts that failed before the first byte and were retried on another replica.",
		}, []string{"replica"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_health_transitions_total",
			Help: "Health state transitions, by replica and from/to state.",
		}, []string{"replica", "from", "to"}),
		scrapes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_scrapes_total",
			Help: "Metrics scrapes of replicas, by result (ok|error).",
		}, []string{"replica", "result"}),
		dropped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "llmlb_replica_models_dropped",
			Help: "Models the replica's last /v1/models listed beyond scrape.max_models or scrape.max_model_name_bytes, ignored.",
		}, []string{"replica"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_config_reloads_total",
			Help: "Configuration reloads (SIGHUP), by result: applied, partial (some replicas failed) or rejected (invalid file).",
		}, []string{"result"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_time_to_first_token_seconds",
			Help:    "Streamed responses: time from the request's arrival to the first generated token (content, reasoning or tool call), by model and route reason.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16), // 10 ms .. ~5.5 min
		}, []string{"model", "route"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_request_duration_seconds",
			Help:    "Completions and embeddings relayed to a replica: time from the request's arrival to the end of the response, by model and route reason.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18), // 10 ms .. ~22 min
		}, []string{"model", "route"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_tokens_total",
			Help: "Tokens reported in the usage of responses, by model and kind: prompt, cached (prompt tokens the replica took from its prefix cache) and completion.",
		}, []string{"model", "kind"}),
		tokenizerChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "llmlb_tokenizer_checks_total",
			Help: "Responses whose prompt the model's configured tokenizer (tokenizers[]) counted, by model and result: match when the engine's usage.prompt_tokens is the same count, mismatch when not (the prompt is rendered or tokenized unlike the engine: its KV cache events will not match).",
		}, []string{"model", "result"}),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "llmlb_flow_queue_wait_seconds",
			Help:    "How long requests waited in flow control before a replica had room, by priority (beyond ±10 counted at ±10); requests never held are not observed.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 16), // 5 ms .. ~2.7 min
		}, []string{"priority"}),
		bal:     bal,
		now:     now,
		decided: newDecisionMetrics(),
	}
	m.reg.MustRegister(m.decided.collectors()...)
	info := version.Get()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "llmlb_build_info",
		Help:        "Always 1; its labels say which llmlb is running.",
		ConstLabels: prometheus.Labels{"version": info.Version, "revision": info.Revision, "goversion": info.GoVersion},
	})
	buildInfo.Set(1)
	indexBudget := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmlb_kv_index_budget_blocks",
		Help: "Most prompt blocks the cost policy's block index holds, all replicas together; replicas' KV capacities are scaled down together beyond it.",
	})
	indexBudget.Set(kvindex.DefaultBudgetBlocks)
	m.reg.MustRegister(m.requests, m.firstByte, m.streamErrs, m.failovers, m.transitions, m.scrapes, m.reloads, m.dropped,
		m.queueWait, m.tokenizerChecks, buildInfo, indexBudget,
		&modelSeries{m: m, cs: []prometheus.Collector{m.ttft, m.duration, m.tokens}},
		&stateCollector{bal: bal, now: now},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// modelSeries creates the series of every known model before collecting
// the client-facing vectors, so a model's latency and token series exist
// (at zero) as soon as a replica is known to serve it.
// One collector holds the three vectors: the registry collects collectors
// concurrently, so a model's series must all exist before any is collected.
type modelSeries struct {
	m  *Metrics
	cs []prometheus.Collector
}

func (s *modelSeries) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range s.cs {
		c.Describe(ch)
	}
}

func (s *modelSeries) Collect(ch chan<- prometheus.Metric) {
	models := s.m.bal.Models()
	s.m.initModel(OtherModel)
	for _, model := range models[:min(len(models), MaxModelSeries)] {
		if len(model) <= MaxModelLabelBytes {
			s.m.initModel(model)
		}
	}
	for _, c := range s.cs {
		c.Collect(ch)
	}
}

// initModel creates a model's client-facing series once, and reports
// whether the model has its own series (false: the cap is reached, count
// it as OtherModel). OtherModel itself is not counted against the cap.
func (m *Metrics) initModel(model string) bool {
	model = label(model)
	if _, done := m.known.Load(model); done {
		return true
	}
	m.modelsMu.Lock()
	defer m.modelsMu.Unlock()
	if _, done := m.known.Load(model); done {
		return true
	}
	if model != OtherModel {
		if m.nModels >= MaxModelSeries {
			return false
		}
		m.nModels++
	}
	// Children first, then the mark: whoever sees the mark sees the series.
	for _, r := range routeReasons {
		m.ttft.WithLabelValues(model, r)
		m.duration.WithLabelValues(model, r)
	}
	for _, k := range tokenKinds {
		m.tokens.WithLabelValues(model, k)
	}
	m.known.Store(model, true)
	return true
}

// ModelLabel bounds a model name to the models some replica serves, and
// to MaxModelSeries of them; anything else is OtherModel.
func (m *Metrics) ModelLabel(model string) string {
	if _, ok := m.known.Load(model); ok {
		return model
	}
	if model == "" || len(model) > MaxModelLabelBytes {
		return OtherModel
	}
	if i, found := m.bal.ModelRank(model); found && i < MaxModelSeries && m.initModel(model) {
		return model
	}
	return OtherModel
}

// Completion observes one response relayed from a replica: its duration
// from arrival to end, its time to first token when streamed (ttft < 0:
// not streamed or no token), and the usage it reported.
func (m *Metrics) Completion(model string, route balancer.Reason, ttft, total time.Duration, u openai.TokenCounts) {
	model = m.ModelLabel(model)
	if !knownRoute(route) {
		m.completionUncached(model, route, ttft, total, u)
		return
	}
	s := m.cache.completions.get(&m.cache.mu, completionKey{model, route}, func() *completionSeries {
		r := string(route)
		return &completionSeries{
			ttft: m.ttft.WithLabelValues(model, r), duration: m.duration.WithLabelValues(model, r),
			prompt: m.tokens.WithLabelValues(model, "prompt"), cached: m.tokens.WithLabelValues(model, "cached"),
			completion: m.tokens.WithLabelValues(model, "completion"),
		}
	})
	if ttft >= 0 {
		s.ttft.Observe(ttft.Seconds())
	}
	s.duration.Observe(total.Seconds())
	if u.PromptTokens > 0 {
		s.prompt.Add(float64(u.PromptTokens))
	}
	if u.CachedTokens > 0 {
		s.cached.Add(float64(u.CachedTokens))
	}
	if u.CompletionTokens > 0 {
		s.completion.Add(float64(u.CompletionTokens))
	}
}

// TokenizerCheck counts one response whose prompt the model's tokenizer
// counted: match when the engine reported the same prompt_tokens.
func (m *Metrics) TokenizerCheck(model string, match bool) {
	result := "mismatch"
	if match {
		result = "match"
	}
	m.tokenizerChecks.WithLabelValues(m.ModelLabel(model), result).Inc()
}

// completionUncached is Completion for a route whose series are not made
// with a model's: each series is made only when something is counted in it.
func (m *Metrics) completionUncached(model string, route balancer.Reason, ttft, total time.Duration, u openai.TokenCounts) {
	r := label(string(route))
	if ttft >= 0 {
		m.ttft.WithLabelValues(model, r).Observe(ttft.Seconds())
	}
	m.duration.WithLabelValues(model, r).Observe(total.Seconds())
	if u.PromptTokens > 0 {
		m.tokens.WithLabelValues(model, "prompt").Add(float64(u.PromptTokens))
	}
	if u.CachedTokens > 0 {
		m.tokens.WithLabelValues(model, "cached").Add(float64(u.CachedTokens))
	}
	if u.CompletionTokens > 0 {
		m.tokens.WithLabelValues(model, "completion").Add(float64(u.CompletionTokens))
	}
}

// InitReplica creates a replica's per-replica event series at zero, so
// dashboards and alerts see every known replica from the start (an idle
// replica is a 0, not a missing series).
func (m *Metrics) InitReplica(replica string) {
	r := label(replica)
	m.requests.WithLabelValues(r, string(balancer.ReasonLoad), "200")
	m.firstByte.WithLabelValues(r)
	m.streamErrs.WithLabelValues(r)
	m.failovers.WithLabelValues(r)
	m.scrapes.WithLabelValues(r, "ok")
	m.scrapes.WithLabelValues(r, "error")
	m.decided.init(r)
}

// Registry returns the registry served on /metrics.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Request counts one answered client request.
func (m *Metrics) Request(replica string, reason balancer.Reason, code int) {
	m.cache.requests.get(&m.cache.mu, requestKey{replica, reason, code}, func() prometheus.Counter {
		return m.requests.WithLabelValues(label(replica), label(string(reason)), strconv.Itoa(code))
	}).Inc()
}

// FirstByte observes the time to first byte of a replica's response.
func (m *Metrics) FirstByte(replica string, d time.Duration) {
	m.cache.firstByte.get(&m.cache.mu, replica, func() prometheus.Observer {
		return m.firstByte.WithLabelValues(label(replica))
	}).Observe(d.Seconds())
}

// StreamError counts a response broken after its first byte.
func (m *Metrics) StreamError(replica string) { m.streamErrs.WithLabelValues(label(replica)).Inc() }

// Failover counts an attempt that failed before the first byte.
func (m *Metrics) Failover(replica string) { m.failovers.WithLabelValues(label(replica)).Inc() }

// Transitions counts health transitions.
func (m *Metrics) Transitions(ts []balancer.Transition) {
	for _, t := range ts {
		m.transitions.WithLabelValues(label(t.Replica), label(t.From.String()), label(t.To.String())).Inc()
	}
}

// Scrape counts one scrape result of a replica.
func (m *Metrics) Scrape(replica string, ok bool) {
	result := "ok"
	if !ok {
		result = "error"
	}
	m.scrapes.WithLabelValues(label(replica), result).Inc()
}

// ModelsDropped records how many models a replica's last /v1/models listed
// beyond the bounds.
func (m *Metrics) ModelsDropped(replica string, n int) {
	m.dropped.WithLabelValues(label(replica)).Set(float64(n))
}

// Reload counts one configuration reload by result (applied, partial,
// rejected).
func (m *Metrics) Reload(result string) { m.reloads.WithLabelValues(label(result)).Inc() }

// label makes s a valid label value: the Prometheus client panics on
// invalid UTF-8 (docs/SECURITY.md). Names are validated before they get
// here; this is defence in depth, and a no-op for valid strings.
func label(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// ForgetReplica drops the per-replica event series of a removed replica.
func (m *Metrics) ForgetReplica(replica string) {
	l := prometheus.Labels{"replica": label(replica)}
	// Under the cache's lock, children dropped first: a request cannot
	// cache a child of the series deleted here in between.
	m.cache.mu.Lock()
	defer m.cache.mu.Unlock()
	m.cache.forget(l["replica"])
	m.decided.forget(l)
	m.requests.DeletePartialMatch(l)
	m.firstByte.DeletePartialMatch(l)
	m.streamErrs.DeletePartialMatch(l)
	m.failovers.DeletePartialMatch(l)
	m.transitions.DeletePartialMatch(l)
	m.scrapes.DeletePartialMatch(l)
	m.dropped.DeletePartialMatch(l)
}

// stateCollector reads the routing core's state when /metrics is scraped.
type stateCollector struct {
	bal *balancer.Balancer
	now func() time.Time
}

var (
	descInFlight       = prometheus.NewDesc("llmlb_replica_in_flight", "The balancer's own in-flight requests to the replica.", []string{"replica"}, nil)
	descInFlightWeight = prometheus.NewDesc("llmlb_replica_in_flight_weight", "The balancer's in-flight requests to the replica, each weighted by its estimated tokens (routing.load.token_unit tokens weigh 1).", []string{"replica"}, nil)
	descEffRunning     = prometheus.NewDesc("llmlb_replica_effective_running", "The running load the routing counts on the replica, token-weighted (1 = routing.load.token_unit tokens): the larger of the scraped running count and the balancer's own in-flight weight. vLLM's own count is llmlb_replica_scraped_running.", []string{"replica"}, nil)
	descEffWaiting     = prometheus.NewDesc("llmlb_replica_effective_waiting", "The queued load the routing counts on the replica, token-weighted: the scraped waiting count plus the balancer's in-flight weight not yet seen running. vLLM's own count is llmlb_replica_scraped_waiting.", []string{"replica"}, nil)
	descScrRunning     = prometheus.NewDesc("llmlb_replica_scraped_running", "vllm:num_requests_running at the last scrape.", []string{"replica"}, nil)
	descScrWaiting     = prometheus.NewDesc("llmlb_replica_scraped_waiting", "vllm:num_requests_waiting at the last scrape.", []string{"replica"}, nil)
	descLoad           = prometheus.NewDesc("llmlb_replica_load", "The load the routing counts on the replica: effective running plus waiting, requests weighted by their tokens (1 = routing.load.token_unit tokens).", []string{"replica"}, nil)
	descKV             = prometheus.NewDesc("llmlb_replica_kv_cache_usage", "Deprecated (removed in the next release): use llmlb_replica_kv_cache_usage_ratio.", []string{"replica"}, nil)
	descKVRatio        = prometheus.NewDesc("llmlb_replica_kv_cache_usage_ratio", "Share of the replica's KV cache in use (0 to 1) at the last scrape.", []string{"replica"}, nil)
	descTTFTError      = prometheus.NewDesc("llmlb_replica_ttft_prediction_error_ratio", "How far policy cost's time-to-first-token estimates for the replica are off: the median of |estimate - measured| / measured over its latest 256 streamed first tokens (0.25 = a quarter off).", []string{"replica"}, nil)
	descTTFTRatio      = prometheus.NewDesc("llmlb_replica_ttft_prediction_ratio", "The median of estimate / measured time to first token over the replica's latest 256 streamed first tokens: 1 is right, below 1 the replica is slower than policy cost expects.", []string{"replica"}, nil)
	descTTFTChecked    = prometheus.NewDesc("llmlb_replica_ttft_predictions_total", "Streamed first tokens whose time was checked against policy cost's estimate.", []string{"replica"}, nil)
	descMaxCooldown    = prometheus.NewDesc("llmlb_max_cooldown_seconds", "The cap of a replica's ejection cooldown (routing.health.max_cooldown); a replica at the cap is flapping.", nil, nil)
	descState          = prometheus.NewDesc("llmlb_replica_state", "1 for the replica's current health state (LIVE|PROBING|EJECTED).", []string{"replica", "state"}, nil)
	descDraining       = prometheus.NewDesc("llmlb_replica_draining", "1 when the replica is draining (no new traffic).", []string{"replica"}, nil)
	descCooldown       = prometheus.NewDesc("llmlb_replica_cooldown_seconds", "Current ejection cooldown of the replica.", []string{"replica"}, nil)
	descRepEjections   = prometheus.NewDesc("llmlb_replica_ejections_total", "Ejections of the replica.", []string{"replica"}, nil)
	descPins           = prometheus.NewDesc("llmlb_pins", "Pins in the table, by kind (session|prefix).", []string{"kind"}, nil)
	descPinBytes       = prometheus.NewDesc("llmlb_pin_bytes", "Estimated memory of the pin table (bounded by routing.affinity.max_pin_bytes).", nil, nil)
	descPinEvictions   = prometheus.NewDesc("llmlb_pin_evictions_total", "Pins evicted at the table's bounds, by whether they had been reused (reused pins are evicted only by other reused pins).", []string{"reused"}, nil)
	descSpills         = prometheus.NewDesc("llmlb_spills_total", "Requests whose pinned replica was too busy, routed to a less loaded one instead.", nil, nil)
	descRebinds        = prometheus.NewDesc("llmlb_rebinds_total", "Session pins rebound after repeated spills.", nil, nil)
	descForceRebinds   = prometheus.NewDesc("llmlb_force_rebinds_total", "Pins moved at once because running(pin) - min_r reached the gap.", nil, nil)
	descPrefixDrops    = prometheus.NewDesc("llmlb_prefix_pin_drops_total", "Prefix pins deleted on a repeated spill.", nil, nil)
	descEjections      = prometheus.NewDesc("llmlb_ejections_total", "Ejections of all replicas.", nil, nil)
	descFallbacks      = prometheus.NewDesc("llmlb_fallbacks_total", "Requests routed by the last-resort fallback.", nil, nil)
	descAlerts         = prometheus.NewDesc("llmlb_alerts_firing", "Alerts llmlb raises itself, by name (imbalance, one_replica, probe_broken, flapping): 1 while firing.", []string{"name"}, nil)
)

var healthStates = []string{"LIVE", "PROBING", "EJECTED"}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInFlight, descInFlightWeight, descEffRunning, descEffWaiting,
		descScrRunning, descScrWaiting, descLoad, descKV, descKVRatio, descTTFTError, descTTFTRatio, descTTFTChecked, descMaxCooldown, descState, descDraining, descCooldown, descRepEjections,
		descPins, descPinBytes, descPinEvictions, descSpills, descRebinds, descForceRebinds, descPrefixDrops, descEjections, descFallbacks, descAlerts} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	now := c.now()
	// NewConstMetric, not MustNewConstMetric: a bad label value costs one
	// series (reported by the registry), never the process.
	emit := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		for i := range labels {
			labels[i] = label(labels[i])
		}
		m, err := prometheus.NewConstMetric(d, t, v, labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) { emit(d, prometheus.GaugeValue, v, labels...) }
	counter := func(d *prometheus.Desc, v float64, labels ...string) { emit(d, prometheus.CounterValue, v, labels...) }
	for _, r := range c.bal.Replicas(now) {
		gauge(descInFlight, float64(r.InFlight), r.Name)
		gauge(descInFlightWeight, r.InFlightWeight, r.Name)
		gauge(descEffRunning, r.EffectiveRunning, r.Name)
		gauge(descEffWaiting, r.EffectiveWaiting, r.Name)
		gauge(descScrRunning, r.ScrapedRunning, r.Name)
		gauge(descScrWaiting, r.ScrapedWaiting, r.Name)
		gauge(descLoad, r.Load, r.Name)
		gauge(descKV, r.KVCacheUsage, r.Name)
		gauge(descKVRatio, r.KVCacheUsage, r.Name)
		gauge(descTTFTError, r.TTFTPredictionError, r.Name)
		gauge(descTTFTRatio, r.TTFTPredictionRatio, r.Name)
		counter(descTTFTChecked, float64(r.TTFTPredictions), r.Name)
		for _, s := range healthStates {
			gauge(descState, b2f(r.State == s), r.Name, s)
		}
		gauge(descDraining, b2f(r.Draining), r.Name)
		gauge(descCooldown, r.CooldownSeconds, r.Name)
		counter(descRepEjections, float64(r.Ejections), r.Name)
	}
	gauge(descMaxCooldown, c.bal.Config().Health.MaxCooldown.Seconds())
	// Pins are llmlb's and llmlb-warm's; under other policies the series
	// stay, at 0, so that dashboards and alerts keep their queries.
	var session, prefix int
	var pinBytes int64
	var evOneShot, evReused uint64
	var pk policy.PinCounters
	c.bal.Inspect(func(p policy.Policy) {
		if t, ok := p.(policy.PinTable); ok {
			session, prefix = t.PinCounts()
			pinBytes, evOneShot, evReused = t.PinMemory()
			pk = t.PinCounters()
		}
	})
	gauge(descPins, float64(session), "session")
	gauge(descPins, float64(prefix), "prefix")
	gauge(descPinBytes, float64(pinBytes))
	counter(descPinEvictions, float64(evOneShot), "false")
	counter(descPinEvictions, float64(evReused), "true")
	counter(descSpills, float64(pk.Spills))
	counter(descRebinds, float64(pk.Rebinds))
	counter(descForceRebinds, float64(pk.ForceRebinds))
	counter(descPrefixDrops, float64(pk.PrefixDrops))
	k := c.bal.Counters()
	counter(descEjections, float64(k.Ejections))
	counter(descFallbacks, float64(k.Fallbacks))
	firing := map[string]float64{"imbalance": 0, "one_replica": 0, "probe_broken": 0, "flapping": 0}
	for _, a := range c.bal.Alerts(now) {
		firing[a.Name]++
	}
	for name, v := range firing {
		gauge(descAlerts, v, name)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
