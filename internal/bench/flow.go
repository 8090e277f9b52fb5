package bench

import (
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/admission"
	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/flowcontrol"
	"github.com/llmlb/llmlb/internal/workload"
)

// flow is one run's flow control: a gate in front of each routing core
// (package admission, the code `serve` runs), the requests they hold, and
// what the saturation signal looked like at each scrape.
//
// The driver's part is the shell's: Admit at arrival; a queued request
// waits here, nothing sent to any replica; after every event that may have
// made room (an engine event, a scrape, a tick, an arrival) Pump, and each
// ticket's request starts on its reserved replica at that virtual instant;
// a request's queue timeout is an event of its own (Expire exactly when
// the oldest held request has waited max_queue_time: a 429 queue_timeout);
// Done when a request the gate let through ends.
type flow struct {
	cfg   flowcontrol.Config
	gates []*admission.Gate
	bals  []*balancer.Balancer

	nextID uint64
	held   map[uint64]*heldRequest // by admission.Request.ID
	order  []*heldRequest          // held requests in admission order (queue timeouts), gone ones skipped
	head   int                     // order[:head] are gone

	limits limitTracker
}

// heldRequest is a request flow control holds.
type heldRequest struct {
	req      *workload.Request
	admitted admission.Request
	core     int
	arrived  time.Duration
	gone     bool // dispatched or expired
}

func newFlow(cfg flowcontrol.Config, bals []*balancer.Balancer, prof engine.Profile, duration time.Duration) *flow {
	f := &flow{cfg: cfg, bals: bals, held: make(map[uint64]*heldRequest)}
	for _, b := range bals {
		f.gates = append(f.gates, admission.New(b, cfg))
	}
	f.limits.maxNumSeqs = prof.MaxNumSeqs
	f.limits.window = max(duration/limitWindows, time.Second)
	return f
}

// holding reports whether any gate holds a request.
func (f *flow) holding() bool { return len(f.held) > 0 }

// bodyBytes estimates a request's body: about four bytes of text a token,
// what flow_control.max_queued_bytes counts.
func bodyBytes(req *workload.Request) int64 { return 4 * int64(req.Prompt.Tokens) }

// admit asks the core's gate what to do with req at now. It returns the
// gate's record when the request may be routed at once; nil when it waits
// (a later pump routes it) or was refused (counted, and the workload told
// it ended, as a client answered 429).
func (r *run) admit(req *workload.Request, core int) (*admission.Request, error) {
	f := r.fc
	f.nextID++
	h := &heldRequest{req: req, core: core, arrived: r.now}
	h.admitted = admission.Request{ID: f.nextID, Profile: &req.Profile, Priority: req.Priority,
		Tenant: req.Tenant, Bytes: bodyBytes(req), Payload: h}
	d, err := f.gates[core].Admit(&h.admitted, r.at())
	if err != nil {
		return nil, err
	}
	switch d.Outcome {
	case flowcontrol.Dispatch:
		return &h.admitted, nil
	case flowcontrol.Queued:
		f.held[h.admitted.ID] = h
		f.order = append(f.order, h)
		r.acc.queued(len(f.held))
		r.rekeyExpire()
	default:
		r.acc.refuse(req, d.Reason.Code())
		r.wl.Complete(req, r.now)
	}
	return nil, nil
}

// pump dispatches what the gates hold while their pools have room: each
// ticket's request starts on the replica reserved for it, now.
func (r *run) pump() {
	f := r.fc
	for core, g := range f.gates {
		if g.Len() == 0 {
			continue
		}
		for _, t := range g.Pump(r.at()) {
			h := t.Request.Payload.(*heldRequest)
			f.release(h)
			r.acc.waited(t.Waited)
			if t.Err != nil { // no replica at all: 503, as Select's error
				r.acc.failed++
				r.ended(core, t.Request)
				r.wl.Complete(h.req, r.now)
				continue
			}
			r.route(h.req, core, t.Res, h.arrived, t.Request)
		}
	}
	r.rekeyExpire()
	r.rekeyArrival()
}

// expire answers the requests that waited max_queue_time: 429
// queue_timeout.
func (r *run) expire() {
	f := r.fc
	for _, g := range f.gates {
		for _, a := range g.Expire(r.at()) {
			h := a.Payload.(*heldRequest)
			f.release(h)
			r.acc.refuse(h.req, "queue_timeout")
			r.wl.Complete(h.req, r.now)
		}
	}
	r.rekeyExpire()
	r.rekeyArrival()
}

// release forgets a held request (dispatched or expired).
func (f *flow) release(h *heldRequest) {
	h.gone = true
	delete(f.held, h.admitted.ID)
	for f.head < len(f.order) && f.order[f.head].gone {
		f.order[f.head] = nil
		f.head++
	}
	if f.head > 1024 && f.head > len(f.order)/2 {
		f.order = append(f.order[:0], f.order[f.head:]...)
		f.head = 0
	}
}

// rekeyExpire keys the queue-timeout source at the gates' next expiry.
func (r *run) rekeyExpire() {
	f := r.fc
	for f.head < len(f.order) && f.order[f.head].gone {
		f.head++
	}
	next, ok := time.Time{}, false
	for _, g := range f.gates {
		if t, gok := g.NextExpiry(); gok && (!ok || t.Before(next)) {
			next, ok = t, true
		}
	}
	if !ok {
		r.h.set(r.srcExpire, never)
		return
	}
	r.h.set(r.srcExpire, int64(max(next.Sub(Epoch), r.now)))
}

// stillHeld returns the requests the gates hold at the run's end, in
// admission order.
func (f *flow) stillHeld() []*heldRequest {
	var out []*heldRequest
	for _, h := range f.order[f.head:] {
		if !h.gone {
			out = append(out, h)
		}
	}
	return out
}

// sample records the saturation signal as replica name's scrape left it:
// the running-slot limit core 0 has learned for it, whether it counts as
// full and whether the pool is saturated, beside the engine's own counts.
func (f *flow) sample(name string, snap balancer.Snapshot, at time.Duration) {
	b := f.bals[0]
	for _, st := range b.Replicas(Epoch.Add(at)) {
		if st.Name == name {
			f.limits.add(at, st.MaxRunning, snap.Running, snap.Waiting, st.Full, b.Saturated("", Epoch.Add(at)))
			return
		}
	}
}

// limitTracker summarizes the learned running-slot limits and the
// saturation signal over a run's scrapes, and keeps a coarse series of
// them (limitWindows windows over the arrivals).
type limitTracker struct {
	maxNumSeqs int
	window     time.Duration
	learned    []float64 // every scrape's learned limit, when known
	samples    int
	full       int // scrapes after which the replica was full
	saturated  int // scrapes after which the pool was saturated
	// runningWaiting: the engine's running count at scrapes that saw
	// requests waiting in it (its plateau at that moment: what the
	// balancer learns from).
	runningWaiting []float64
	windows        []limitWindow
}

// limitWindow sums one window's samples.
type limitWindow struct {
	n, learnedN               int
	learned, running, waiting float64
	full, saturated           int
}

// limitWindows is how many windows the series has over the arrivals.
const limitWindows = 60

func (t *limitTracker) add(at time.Duration, learned, running, waiting float64, full, saturated bool) {
	t.samples++
	w := int(at / t.window)
	for len(t.windows) <= w {
		t.windows = append(t.windows, limitWindow{})
	}
	lw := &t.windows[w]
	lw.n++
	lw.running += running
	lw.waiting += waiting
	if learned > 0 {
		t.learned = append(t.learned, learned)
		lw.learnedN++
		lw.learned += learned
	}
	if full {
		t.full++
		lw.full++
	}
	if saturated {
		t.saturated++
		lw.saturated++
	}
	if waiting > 0 {
		t.runningWaiting = append(t.runningWaiting, running)
	}
}

// stats summarizes the samples (nil when there were none).
func (t *limitTracker) stats() *SaturationStats {
	if t.samples == 0 {
		return nil
	}
	slices.Sort(t.learned)
	slices.Sort(t.runningWaiting)
	s := &SaturationStats{
		Scrapes:              t.samples,
		EngineMaxNumSeqs:     t.maxNumSeqs,
		LearnedShare:         ratio(float64(len(t.learned)), float64(t.samples)),
		FullShare:            ratio(float64(t.full), float64(t.samples)),
		SaturatedShare:       ratio(float64(t.saturated), float64(t.samples)),
		WaitingShare:         ratio(float64(len(t.runningWaiting)), float64(t.samples)),
		LearnedMaxRunning:    spread(t.learned),
		EngineRunningWaiting: spread(t.runningWaiting),
	}
	for i, w := range t.windows {
		if w.n == 0 {
			continue
		}
		p := LimitPoint{Seconds: (time.Duration(i) * t.window).Seconds(),
			Running: w.running / float64(w.n), Waiting: w.waiting / float64(w.n),
			FullShare: float64(w.full) / float64(w.n), SaturatedShare: float64(w.saturated) / float64(w.n)}
		if w.learnedN > 0 {
			p.Learned = w.learned / float64(w.learnedN)
		}
		s.Series = append(s.Series, p)
	}
	return s
}

// spread is the min, deciles and max of sorted values.
func spread(sorted []float64) Spread {
	if len(sorted) == 0 {
		return Spread{}
	}
	return Spread{Min: sorted[0], P10: Percentile(sorted, 10), P50: Percentile(sorted, 50),
		P90: Percentile(sorted, 90), Max: sorted[len(sorted)-1]}
}
