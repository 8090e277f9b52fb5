package admin

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/flowcontrol"
)

// Flow control's metrics: the queues' state is read from the gate at
// collection time; the waits are observed by the proxy as it dispatches.
// Labels stay bounded: a model not served by any replica counts as
// OtherModel, priorities are clamped to ±maxPriorityLabel, and only the
// topTenants tenants with the most requests waiting have a series of their
// own per model (the rest are summed as RestTenants).
const (
	maxPriorityLabel = 10
	topTenants       = 10
	// RestTenants is the tenant label of the waiting requests of tenants
	// beyond the top ones.
	RestTenants = "(rest)"
)

var (
	descFlowQueued      = prometheus.NewDesc("llmlb_flow_queued", "Requests waiting in flow control for a replica of their model to have room, by model and priority (priorities beyond ±10 count at ±10).", []string{"model", "priority"}, nil)
	descFlowQueuedBytes = prometheus.NewDesc("llmlb_flow_queued_bytes", "Request bodies held by the waiting requests, by model.", []string{"model"}, nil)
	descFlowOldest      = prometheus.NewDesc("llmlb_flow_oldest_wait_seconds", "How long the longest-waiting request of the model has waited (0: none waits).", []string{"model"}, nil)
	descFlowTenant      = prometheus.NewDesc("llmlb_flow_tenant_queued", "Requests waiting by model and tenant: the 10 tenants with the most waiting each, the others summed as tenant=\"(rest)\".", []string{"model", "tenant"}, nil)
	descFlowTenants     = prometheus.NewDesc("llmlb_flow_tenants", "Tenants flow control remembers (with requests waiting or running, or a rate limit still refilling), by model.", []string{"model"}, nil)
	descFlowAdmitted    = prometheus.NewDesc("llmlb_flow_admitted_total", "Requests flow control admitted (dispatched at once or queued), by model.", []string{"model"}, nil)
	descFlowDispatched  = prometheus.NewDesc("llmlb_flow_dispatched_total", "Requests flow control let through to a replica, at once or after waiting, by model.", []string{"model"}, nil)
	descFlowExpired     = prometheus.NewDesc("llmlb_flow_expired_total", "Requests that waited flow_control.max_queue_time (standing_queue_time under a standing backlog) and were answered 429 queue_timeout, by model.", []string{"model"}, nil)
	descFlowRemoved     = prometheus.NewDesc("llmlb_flow_removed_total", "Requests that left the queue undispatched: their client went away, or llmlb shut down (503).", []string{"model"}, nil)
	descFlowRefused     = prometheus.NewDesc("llmlb_flow_refused_total", "Requests flow control refused with 429, by model and reason (queue_full, queue_bytes_full, shed, tenant_concurrency, tenant_rate).", []string{"model", "reason"}, nil)
)

// refusalReasons are the reasons every model's refusal series exist for.
var refusalReasons = []flowcontrol.Reason{flowcontrol.QueueFull, flowcontrol.QueueBytesFull, flowcontrol.Shed,
	flowcontrol.TenantConcurrency, flowcontrol.TenantRate}

// RegisterQueue exposes flow control's state read from g at collection
// time. Call it once.
func (m *Metrics) RegisterQueue(g *admission.Gate) {
	m.reg.MustRegister(&queueCollector{m: m, g: g})
}

// QueueWait observes the wait of a request dispatched from the queue
// (proxy.QueueRecorder).
func (m *Metrics) QueueWait(priority int, waited time.Duration) {
	m.queueWait.WithLabelValues(priorityLabel(priority)).Observe(waited.Seconds())
}

// priorityLabel clamps a priority to ±maxPriorityLabel: clients choose
// priorities, and must not choose the number of series.
func priorityLabel(p int) string {
	return strconv.Itoa(min(max(p, -maxPriorityLabel), maxPriorityLabel))
}

type queueCollector struct {
	m *Metrics
	g *admission.Gate
}

// Describe implements prometheus.Collector.
func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFlowQueued, descFlowQueuedBytes, descFlowOldest, descFlowTenant, descFlowTenants,
		descFlowAdmitted, descFlowDispatched, descFlowExpired, descFlowRemoved, descFlowRefused} {
		ch <- d
	}
}

// modelQueue sums the queues whose models share a label.
type modelQueue struct {
	bytes                                  int64
	oldest                                 time.Duration
	tenants                                int
	admitted, dispatched, expired, removed uint64
	queued                                 map[string]int // by priority label
	byTenant                               map[string]int
	refused                                map[flowcontrol.Reason]uint64
}

// Collect implements prometheus.Collector.
func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
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
	byModel := map[string]*modelQueue{}
	for model, st := range c.g.Stats(c.m.now()) {
		name := c.m.ModelLabel(model)
		q := byModel[name]
		if q == nil {
			q = &modelQueue{queued: map[string]int{}, byTenant: map[string]int{}, refused: map[flowcontrol.Reason]uint64{}}
			byModel[name] = q
		}
		q.bytes += st.Bytes
		q.oldest = max(q.oldest, st.OldestWait)
		q.tenants += st.Tenants
		q.admitted += st.Admitted
		q.dispatched += st.Dispatched
		q.expired += st.Expired
		q.removed += st.Removed
		for _, cl := range st.Classes {
			q.queued[priorityLabel(cl.Priority)] += cl.Queued
		}
		for _, t := range st.ByTenant {
			if t.Queued > 0 {
				q.byTenant[t.Tenant] += t.Queued
			}
		}
		for r, n := range st.Refused {
			q.refused[r] += n
		}
	}
	for model, q := range byModel {
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			emit(d, prometheus.GaugeValue, v, append([]string{model}, labels...)...)
		}
		counter := func(d *prometheus.Desc, v float64, labels ...string) {
			emit(d, prometheus.CounterValue, v, append([]string{model}, labels...)...)
		}
		gauge(descFlowQueued, float64(q.queued["0"]), "0") // the default priority's series always exists
		for p, n := range q.queued {
			if p != "0" {
				gauge(descFlowQueued, float64(n), p)
			}
		}
		gauge(descFlowQueuedBytes, float64(q.bytes))
		gauge(descFlowOldest, q.oldest.Seconds())
		gauge(descFlowTenants, float64(q.tenants))
		type tq struct {
			name string
			n    int
		}
		ts := make([]tq, 0, len(q.byTenant))
		for name, n := range q.byTenant {
			ts = append(ts, tq{name, n})
		}
		slices.SortFunc(ts, func(a, b tq) int { return cmp.Or(cmp.Compare(b.n, a.n), cmp.Compare(a.name, b.name)) })
		rest := 0
		for i, t := range ts {
			if i < topTenants && t.name != RestTenants {
				gauge(descFlowTenant, float64(t.n), t.name)
			} else {
				rest += t.n
			}
		}
		if rest > 0 {
			gauge(descFlowTenant, float64(rest), RestTenants)
		}
		counter(descFlowAdmitted, float64(q.admitted))
		counter(descFlowDispatched, float64(q.dispatched))
		counter(descFlowExpired, float64(q.expired))
		counter(descFlowRemoved, float64(q.removed))
		for _, r := range refusalReasons {
			counter(descFlowRefused, float64(q.refused[r]), r.String())
		}
	}
}
