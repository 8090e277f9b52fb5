package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	wire "github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/scrape"
	"github.com/llmlb/llmlb/internal/testutil/syncbuf"
)

// Flow control through the real server and proxy. The replicas are fakes
// that hold every request until the test lets it go, and report idle on
// every scrape; routing.saturation.max_running 1 makes each full at two
// requests in flight (the limit plus one request of headroom), so the
// test decides exactly when the fleet is saturated and when a slot frees.
// Assertions wait on channels and the gate's state, never on time.

// holdFleet is n fake replicas (sim-1, sim-2, ...) that report every
// request as it arrives and answer it 200 when the test closes its done.
type holdFleet struct {
	urls     []string
	arrivals chan *arrival
	closed   chan struct{} // closed at cleanup: every held request ends
	once     sync.Once
}

// arrival is one request that reached a replica.
type arrival struct {
	replica string
	tag     string // the request's X-Test-Tag
	done    chan struct{}
}

func (a *arrival) release() { close(a.done) }

func newHoldFleet(t *testing.T, n int) *holdFleet {
	t.Helper()
	f := &holdFleet{arrivals: make(chan *arrival, 256), closed: make(chan struct{})}
	for i := range n {
		name := fmt.Sprintf("sim-%d", i+1)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			a := &arrival{replica: name, tag: r.Header.Get("X-Test-Tag"), done: make(chan struct{})}
			f.arrivals <- a
			select {
			case <-a.done:
			case <-f.closed:
			case <-r.Context().Done():
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"c","object":"chat.completion","model":"`+model+`","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		}))
		t.Cleanup(srv.Close)
		f.urls = append(f.urls, srv.URL)
	}
	return f
}

func (f *holdFleet) releaseAll() { f.once.Do(func() { close(f.closed) }) }

// startHold runs llmlb with flow control in front of n holding replicas,
// each full at two requests in flight.
func startHold(t *testing.T, n int, logger *slog.Logger, tweak func(*config.Config)) (*env, *holdFleet) {
	t.Helper()
	f := newHoldFleet(t, n)
	fake := scrape.NewFake()
	for _, u := range f.urls {
		fake.Set(u, scrape.Result{}, nil)
		fake.SetModels(u, []string{model}, nil)
	}
	if logger == nil {
		logger = testLogger()
	}
	e := startURLs(t, f.urls, logger, func(c *config.Config) {
		// One slot and one request of headroom each; least in-flight
		// first: the fill requests spread evenly, so the fleet is
		// saturated exactly when every replica holds two.
		c.Routing.Saturation.MaxRunning, c.Routing.Saturation.Headroom = 1, 1
		c.Routing.Policy = policy.NameLeastRequest
		if tweak != nil {
			tweak(c)
		}
	}, WithFetcher(fake))
	t.Cleanup(f.releaseAll) // runs before llmlb's own cleanup drains
	return e, f
}

// answer is a client's view of one response.
type answer struct {
	code   int
	header http.Header
	body   []byte
	err    error
}

// send posts a chat completion tagged tag in the background.
func (e *env) send(ctx context.Context, tag string, hdr map[string]string) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.proxy+"/v1/chat/completions", strings.NewReader(chatBody("flow "+tag, 4)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Test-Tag", tag)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := e.http.Do(req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		ch <- answer{code: res.StatusCode, header: res.Header, body: b, err: err}
	}()
	return ch
}

func (e *env) answer(ch <-chan answer) answer {
	e.t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			e.t.Fatalf("request failed: %v", a.err)
		}
		return a
	case <-time.After(waitFor):
		e.t.Fatal("timed out waiting for an answer")
	}
	return answer{}
}

// next returns the next request to reach a replica.
func (f *holdFleet) next(t *testing.T) *arrival {
	t.Helper()
	select {
	case a := <-f.arrivals:
		return a
	case <-time.After(waitFor):
		t.Fatal("timed out waiting for a request to reach a replica")
	}
	return nil
}

// none fails if a request has reached a replica and not been taken.
func (f *holdFleet) none(t *testing.T, what string) {
	t.Helper()
	select {
	case a := <-f.arrivals:
		t.Fatalf("%s: request %q reached %s", what, a.tag, a.replica)
	default:
	}
}

// fill sends n requests and waits until each holds a replica's slot.
func (e *env) fill(f *holdFleet, n int, hdr map[string]string) (held []*arrival, answers []<-chan answer) {
	e.t.Helper()
	for i := range n {
		answers = append(answers, e.send(context.Background(), fmt.Sprintf("fill-%d", i), hdr))
	}
	for range n {
		held = append(held, f.next(e.t))
	}
	if q := e.srv.Gate().Len(); q != 0 {
		e.t.Fatalf("%d requests queued while filling", q)
	}
	return held, answers
}

// waitQueued polls the gate until n requests wait.
func (e *env) waitQueued(n int) {
	e.t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(waitFor); e.srv.Gate().Len() != n; <-tick.C {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %d queued requests; %d queue", n, e.srv.Gate().Len())
		}
	}
}

// queue sends a request that must wait, and returns once it does.
func (e *env) queue(ctx context.Context, tag string, hdr map[string]string) <-chan answer {
	e.t.Helper()
	before := e.srv.Gate().Len()
	ch := e.send(ctx, tag, hdr)
	e.waitQueued(before + 1)
	return ch
}

func wantError(t *testing.T, a answer, status int, code string) {
	t.Helper()
	var eb wire.ErrorBody
	if err := json.Unmarshal(a.body, &eb); err != nil {
		t.Fatalf("%d %q is not an OpenAI error: %v", a.code, a.body, err)
	}
	if a.code != status || eb.Error.Code != code || eb.Error.Message == "" {
		t.Fatalf("got %d %s, want %d %s", a.code, a.body, status, code)
	}
	if status == http.StatusTooManyRequests {
		if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
			t.Errorf("Retry-After %q, want whole seconds >= 1", a.header.Get("Retry-After"))
		}
		if eb.Error.Type != wire.TypeRateLimit {
			t.Errorf("type %q, want %s", eb.Error.Type, wire.TypeRateLimit)
		}
	}
}

func wantOK(t *testing.T, a answer, replica string) {
	t.Helper()
	if a.code != http.StatusOK {
		t.Fatalf("got %d %s, want 200", a.code, a.body)
	}
	if replica != "" && a.header.Get(proxy.HeaderReplica) != replica {
		t.Errorf("served by %q, want %s", a.header.Get(proxy.HeaderReplica), replica)
	}
}

// (a) Below saturation requests go straight to a replica: nothing waits,
// no response says it waited.
func TestFlowUnsaturatedGoesStraightThrough(t *testing.T) {
	e, f := startHold(t, 2, nil, nil)
	held, answers := e.fill(f, 3, nil) // three of the four slots
	for _, a := range held {
		a.release()
	}
	for _, ch := range answers {
		a := e.answer(ch)
		wantOK(t, a, "")
		if a.header.Get(proxy.HeaderQueueWait) != "" {
			t.Errorf("an unsaturated request says it waited %s ms", a.header.Get(proxy.HeaderQueueWait))
		}
	}
	st := e.srv.Gate().Stats(time.Now())[model]
	if st.Admitted != 3 || st.Dispatched != 3 || st.Queued != 0 || st.Expired+st.Removed != 0 {
		t.Errorf("stats %+v: want 3 admitted and dispatched at once", st)
	}
}

// flow_control.enabled false: a request past saturation goes to a replica
// at once, as before flow control.
func TestFlowDisabledNeverQueues(t *testing.T) {
	e, f := startHold(t, 1, nil, func(c *config.Config) { c.FlowControl.Enabled = false })
	e.fill(f, 2, nil)
	e.send(context.Background(), "extra", nil)
	if a := f.next(t); a.tag != "extra" {
		t.Fatalf("got %q", a.tag)
	}
}

// (b) Saturated: the request waits, nothing reaches any replica, and when
// one replica frees a slot the request goes there. The wait shows in the
// response header, the access log and the metrics.
func TestFlowSaturatedWaitsForTheReplicaThatFrees(t *testing.T) {
	var logs syncbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	e, f := startHold(t, 2, logger, nil)
	held, answers := e.fill(f, 4, nil)

	late := e.queue(context.Background(), "late", nil)
	f.none(t, "saturated")
	e.srv.proxy.Pump() // a pump while every replica is full moves nothing
	if q := e.srv.Gate().Len(); q != 1 {
		t.Fatalf("%d queued after a pump at saturation, want 1", q)
	}
	f.none(t, "saturated, after a pump")
	e.waitMetric(`llmlb_flow_queued{model="sim-model",priority="0"} 1`)

	freed := held[2]
	freed.release()
	a := f.next(t)
	if a.tag != "late" || a.replica != freed.replica {
		t.Fatalf("%q reached %s, want the late request on %s (the replica that freed)", a.tag, a.replica, freed.replica)
	}
	a.release()
	got := e.answer(late)
	wantOK(t, got, freed.replica)
	if _, err := strconv.Atoi(got.header.Get(proxy.HeaderQueueWait)); err != nil {
		t.Errorf("%s = %q, want the wait in ms", proxy.HeaderQueueWait, got.header.Get(proxy.HeaderQueueWait))
	}
	e.waitMetric(`llmlb_flow_queue_wait_seconds_count{priority="0"} 1`)
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(logs.String(), "queue_wait_ms=") {
		if time.Now().After(deadline) {
			t.Fatalf("no access line with queue_wait_ms:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, h := range held {
		if h != freed {
			h.release()
		}
	}
	for _, ch := range answers {
		wantOK(t, e.answer(ch), "")
	}
}

// (c) A client that goes away while its request waits takes it out of the
// queue; it never reaches a replica.
func TestFlowClientGoneWhileQueuedLeaves(t *testing.T) {
	e, f := startHold(t, 1, nil, nil)
	held, _ := e.fill(f, 2, nil)
	ctx, cancel := context.WithCancel(context.Background())
	gone := e.queue(ctx, "gone", nil)
	cancel()
	if a := <-gone; a.err == nil {
		t.Fatalf("the canceled request was answered %d", a.code)
	}
	e.waitQueued(0)
	held[0].release()
	probe := e.send(context.Background(), "probe", nil)
	if a := f.next(t); a.tag != "probe" {
		t.Fatalf("%q reached the replica, want only the probe", a.tag)
	} else {
		a.release()
	}
	wantOK(t, e.answer(probe), "")
	st := e.srv.Gate().Stats(time.Now())[model]
	if st.Removed != 1 || st.Dispatched != 3 {
		t.Errorf("stats %+v: want 1 removed and 3 dispatched (2 fill, the probe)", st)
	}
	held[1].release()
}

// (d) A full queue and a sheddable request at saturation are refused at
// once with 429, Retry-After and an OpenAI error; a malformed priority is
// the client's error.
func TestFlowRefusals(t *testing.T) {
	e, f := startHold(t, 1, nil, func(c *config.Config) { c.FlowControl.MaxQueued = 1 })
	wantError(t, e.answer(e.send(context.Background(), "bad", map[string]string{proxy.HeaderPriority: "urgent"})), http.StatusBadRequest, wire.CodeInvalidPriority)
	held, _ := e.fill(f, 2, nil)
	waiting := e.queue(context.Background(), "waiting", nil)
	wantError(t, e.answer(e.send(context.Background(), "full", nil)), http.StatusTooManyRequests, wire.CodeQueueFull)
	wantError(t, e.answer(e.send(context.Background(), "shed", map[string]string{proxy.HeaderPriority: "-1"})), http.StatusTooManyRequests, wire.CodeShed)
	f.none(t, "after the refusals")
	e.waitMetric(`llmlb_flow_refused_total{model="sim-model",reason="shed"} 1`)
	e.waitMetric(`llmlb_flow_refused_total{model="sim-model",reason="queue_full"} 1`)
	held[0].release()
	a := f.next(t)
	if a.tag != "waiting" {
		t.Fatalf("%q reached the replica, want the waiting request", a.tag)
	}
	a.release()
	wantOK(t, e.answer(waiting), "sim-1")
	held[1].release()
}

// (e) A request that waits flow_control.max_queue_time gets 429
// queue_timeout and never reaches a replica.
func TestFlowQueueTimeout(t *testing.T) {
	e, f := startHold(t, 1, nil, func(c *config.Config) { c.FlowControl.MaxQueueTime = 200 * time.Millisecond })
	held, _ := e.fill(f, 2, nil)
	late := e.queue(context.Background(), "late", nil)
	wantError(t, e.answer(late), http.StatusTooManyRequests, wire.CodeQueueTimeout)
	f.none(t, "after the timeout")
	if st := e.srv.Gate().Stats(time.Now())[model]; st.Expired != 1 || st.Queued != 0 {
		t.Errorf("stats %+v: want 1 expired", st)
	}
	for _, h := range held {
		h.release()
	}
}

// (e2) Under a standing backlog a request that waited
// flow_control.standing_queue_time gets 429 queue_timeout long before
// max_queue_time.
func TestFlowStandingBacklogRefusesEarly(t *testing.T) {
	e, f := startHold(t, 1, nil, func(c *config.Config) {
		c.FlowControl.MaxQueueTime = time.Hour
		c.FlowControl.StandingAfter = 200 * time.Millisecond
		c.FlowControl.StandingQueueTime = 100 * time.Millisecond
	})
	held, _ := e.fill(f, 2, nil)
	late := e.queue(context.Background(), "late", nil)
	wantError(t, e.answer(late), http.StatusTooManyRequests, wire.CodeQueueTimeout)
	f.none(t, "after the timeout")
	if st := e.srv.Gate().Stats(time.Now())[model]; st.Expired != 1 || st.Queued != 0 {
		t.Errorf("stats %+v: want 1 expired", st)
	}
	for _, h := range held {
		h.release()
	}
}

// (f) A replica drained, then removed, while requests wait loses none of
// them: they stay queued and go to the other replica when it has room.
func TestFlowReplicaDrainedWhileWaiting(t *testing.T) {
	e, f := startHold(t, 2, nil, nil)
	held, _ := e.fill(f, 4, nil)
	w1 := e.queue(context.Background(), "w1", nil)
	w2 := e.queue(context.Background(), "w2", nil)
	if !(fleet{e.srv}).SetDraining("sim-1", true) {
		t.Fatal("drain failed")
	}
	var onOther []*arrival
	for _, h := range held {
		if h.replica == "sim-1" {
			h.release() // sim-1 has room, but is draining
		} else {
			onOther = append(onOther, h)
		}
	}
	e.waitReplicas("sim-1 idle", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.Name == "sim-1" {
				return r.InFlight == 0
			}
		}
		return false
	})
	e.srv.proxy.Pump()
	if !(fleet{e.srv}).RemoveReplica("sim-1") {
		t.Fatal("remove failed")
	}
	f.none(t, "sim-1 drained and removed")
	if q := e.srv.Gate().Len(); q != 2 {
		t.Fatalf("%d queued, want both still waiting", q)
	}
	for i, w := range []<-chan answer{w1, w2} {
		onOther[i].release()
		a := f.next(t)
		if a.replica != "sim-2" {
			t.Fatalf("%q reached %s, want sim-2", a.tag, a.replica)
		}
		a.release()
		wantOK(t, e.answer(w), "sim-2")
	}
}

// (g) Shutdown answers every waiting request at once (503, none waits for
// the drain deadline or hangs) and lets those in flight finish.
func TestFlowShutdownAnswersEveryWaiter(t *testing.T) {
	e, f := startHold(t, 1, nil, nil)
	held, fills := e.fill(f, 2, nil)
	var waiting []<-chan answer
	for i := range 3 {
		waiting = append(waiting, e.queue(context.Background(), fmt.Sprintf("w%d", i), nil))
	}
	e.stop()
	for _, w := range waiting {
		wantError(t, e.answer(w), http.StatusServiceUnavailable, wire.CodeShuttingDown)
	}
	f.none(t, "shutdown")
	for _, h := range held {
		h.release()
	}
	for _, ch := range fills {
		wantOK(t, e.answer(ch), "sim-1")
	}
	if err := <-e.done; err != nil {
		t.Errorf("Run returned %v", err)
	}
	e.done <- nil // for the cleanup
}

// (h) A higher-priority request queued after a lower one is dispatched
// first.
func TestFlowHigherPriorityFirst(t *testing.T) {
	e, f := startHold(t, 1, nil, func(c *config.Config) { c.FlowControl.MaxHeaderPriority = 10 })
	held, _ := e.fill(f, 2, nil)
	low := e.queue(context.Background(), "low", nil)
	high := e.queue(context.Background(), "high", map[string]string{proxy.HeaderPriority: "5"})
	var order []string
	for i, w := range []<-chan answer{high, low} {
		held[i].release()
		a := f.next(t)
		order = append(order, a.tag)
		a.release()
		wantOK(t, e.answer(w), "")
	}
	if !slices.Equal(order, []string{"high", "low"}) {
		t.Errorf("dispatched %v, want high before low", order)
	}
}

// (i) Two tenants, one flooding: the polite tenant's request, queued after
// the flood's backlog, is dispatched ahead of it.
func TestFlowPoliteTenantAheadOfTheFlood(t *testing.T) {
	e, f := startHold(t, 1, nil, nil)
	flood := map[string]string{"x-project-id": "flood"}
	held, _ := e.fill(f, 2, flood)
	var waiting []<-chan answer
	for i := range 6 {
		waiting = append(waiting, e.queue(context.Background(), fmt.Sprintf("flood-%d", i), flood))
	}
	waiting = append(waiting, e.queue(context.Background(), "polite", map[string]string{"x-project-id": "polite"}))
	// One slot frees at a time: each release dispatches exactly one.
	cur := held[0]
	var order []string
	for range waiting {
		cur.release()
		cur = f.next(t)
		order = append(order, cur.tag)
	}
	cur.release()
	held[1].release()
	for _, w := range waiting {
		wantOK(t, e.answer(w), "")
	}
	if i := slices.Index(order, "polite"); i < 0 || i > 1 {
		t.Errorf("dispatch order %v: the polite request went %d of 7, want among the first 2 (fair shares)", order, i+1)
	}
}

// (j) The reserve: a tenant over its share fills the replicas only up to
// their limit less the reserve; a polite request arriving while the
// flood's wait is sent at once into a reserved slot, through serve.
func TestFlowPoliteTenantTakesTheReserve(t *testing.T) {
	e, f := startHold(t, 2, nil, func(c *config.Config) {
		c.Routing.Saturation.MaxRunning, c.Routing.Saturation.Headroom = 4, 0
		c.Routing.Saturation.ReserveShare = 0.25 // 1 slot of 4
	})
	polite := map[string]string{"x-project-id": "polite"}
	flood := map[string]string{"x-project-id": "flood"}
	heldPolite, _ := e.fill(f, 1, polite)
	heldFlood, _ := e.fill(f, 5, flood) // 3 on each replica with the polite one
	waiting := e.queue(context.Background(), "flood-held", flood)
	p := e.send(context.Background(), "polite-2", polite)
	a := f.next(t) // reaches a replica with nothing released
	if a.tag != "polite-2" {
		t.Fatalf("%q reached %s, want the polite request", a.tag, a.replica)
	}
	if n := e.srv.Gate().Len(); n != 1 {
		t.Errorf("%d requests wait, want the flood's one", n)
	}
	a.release()
	wantOK(t, e.answer(p), "")
	for _, h := range append(heldPolite, heldFlood...) {
		h.release()
	}
	f.next(t).release() // the flood's held request, once slots free
	wantOK(t, e.answer(waiting), "")
}

// (k) flow_control.engine_priority writes each request's priority into the
// body as vLLM's priority field, negated (vLLM serves lower values first),
// over any the client sent; off, the body goes as it came.
func TestFlowEnginePriority(t *testing.T) {
	for _, on := range []bool{true, false} {
		bodies := make(chan string, 4)
		upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			bodies <- string(b)
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"model":"sim-model","choices":[{"message":{"role":"assistant","content":"hi"}}]}`)
		}))
		fake := scrape.NewFake()
		fake.Set(upstream.URL, scrape.Result{}, nil)
		fake.SetModels(upstream.URL, []string{model}, nil)
		e := startURLs(t, []string{upstream.URL}, testLogger(), func(c *config.Config) {
			c.FlowControl.EnginePriority, c.FlowControl.MaxHeaderPriority = on, 10
		}, WithFetcher(fake))
		for _, prio := range []string{"3", ""} {
			req, _ := http.NewRequest(http.MethodPost, e.proxy+"/v1/chat/completions",
				strings.NewReader(`{"model":"`+model+`","priority":-50,"messages":[{"role":"user","content":"hi"}]}`))
			req.Header.Set("Content-Type", "application/json")
			if prio != "" {
				req.Header.Set(proxy.HeaderPriority, prio)
			}
			res, err := e.http.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			var sent struct{ Priority int }
			b := <-bodies
			if err := json.Unmarshal([]byte(b), &sent); err != nil {
				t.Fatalf("replica got %q: %v", b, err)
			}
			want := -50 // the client's own field, untouched
			if on && prio == "3" {
				want = -3
			} else if on {
				want = 0
			}
			if sent.Priority != want {
				t.Errorf("engine_priority %v, header %q: replica got priority %d (%s), want %d", on, prio, sent.Priority, b, want)
			}
		}
		upstream.Close()
	}
}
