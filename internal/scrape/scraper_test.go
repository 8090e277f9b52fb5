package scrape

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/health"
)

// recordingSink records every call and signals each ObserveScrape on obs.
type recordingSink struct {
	mu     sync.Mutex
	scrape map[string][]observed
	models map[string][][]string
	obs    chan string
	stop   chan struct{}         // closed by the test before it stops reading obs
	trs    []balancer.Transition // returned by every ObserveScrape that failed
}

type observed struct {
	snap balancer.Snapshot
	err  error
}

// newSink returns a sink whose obs channel holds buffer signals; with 0 the
// loop cannot run ahead of the test by more than one scrape.
func newSink(buffer int) *recordingSink {
	return &recordingSink{
		scrape: make(map[string][]observed),
		models: make(map[string][][]string),
		obs:    make(chan string, buffer),
		stop:   make(chan struct{}),
	}
}

func (s *recordingSink) ObserveScrape(name string, snap balancer.Snapshot, err error, now time.Time) []balancer.Transition {
	s.mu.Lock()
	s.scrape[name] = append(s.scrape[name], observed{snap, err})
	s.mu.Unlock()
	select {
	case s.obs <- name:
	case <-s.stop:
	}
	if err != nil {
		return s.trs
	}
	return nil
}

func (s *recordingSink) SetModels(name string, models []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models[name] = append(s.models[name], models)
}

func (s *recordingSink) observed(name string) []observed {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]observed(nil), s.scrape[name]...)
}

// waitFor blocks until name has been observed n more times (generous
// deadline: it guards against hangs, it does not measure anything).
func (s *recordingSink) waitFor(t *testing.T, name string, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for n > 0 {
		select {
		case got := <-s.obs:
			if got == name {
				n--
			}
		case <-deadline:
			t.Fatalf("timed out waiting for %d more scrapes of %s", n, name)
		}
	}
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestScraperLoop(t *testing.T) {
	fake := NewFake()
	fake.Set("http://a", Result{Snapshot: balancer.Snapshot{Running: 3, Waiting: 1, KVCacheUsage: 0.5}}, nil)
	fake.SetModels("http://a", []string{"qwen"}, nil)
	errDown := errors.New("connection refused")
	fake.Set("http://b", Result{}, errDown)
	fake.SetModels("http://b", []string{"never-asked"}, nil)
	fake.Set("http://c", Result{}, nil)
	fake.SetModels("http://c", []string{"learned"}, nil)

	sink := newSink(4096)
	tr := balancer.Transition{Replica: "b", Transition: health.Transition{From: health.Live, To: health.Ejected}}
	sink.trs = []balancer.Transition{tr}

	var mu sync.Mutex
	var gotTrs []balancer.Transition
	scrapes := map[string]int{}
	failures := map[string]int{}
	results := map[string]int{}
	s := New(fake, sink, Options{
		Interval: time.Millisecond,
		Logger:   quiet,
		OnTransitions: func(trs []balancer.Transition) {
			mu.Lock()
			defer mu.Unlock()
			gotTrs = append(gotTrs, trs...)
		},
		OnScrape: func(name string, err error, took time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			scrapes[name]++
			if err != nil {
				failures[name]++
			}
		},
		OnResult: func(name string, _ Result, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			results[name]++
		},
	})
	for _, tg := range []Target{
		{Name: "a", URL: "http://a", APIKey: "sk-a"},
		{Name: "b", URL: "http://b"},
		{Name: "c", URL: "http://c", Models: []string{"declared"}},
	} {
		if err := s.Add(tg); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Add(Target{Name: "a", URL: "http://other"}); err == nil {
		t.Error("adding a duplicate name: want an error")
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()

	sink.waitFor(t, "a", 3)
	sink.waitFor(t, "b", 3) // an ejected (failing) replica keeps being scraped

	// Added at run time: scraped at once.
	fake.Set("http://d", Result{Snapshot: balancer.Snapshot{Waiting: 2}}, nil)
	fake.SetModels("http://d", []string{"m1", "m2"}, nil)
	if err := s.Add(Target{Name: "d", URL: "http://d"}); err != nil {
		t.Fatal(err)
	}
	sink.waitFor(t, "d", 2)

	// Removed at run time: Remove returns after its loop ended, so the
	// call count stays put while the others go on.
	if !s.Remove("b") {
		t.Fatal("Remove(b) = false")
	}
	if s.Remove("b") {
		t.Error("second Remove(b) = true")
	}
	callsB := fake.Calls("http://b")
	sink.waitFor(t, "a", 3)
	if got := fake.Calls("http://b"); got != callsB {
		t.Errorf("b scraped %d times after Remove", got-callsB)
	}

	if got := s.Run(ctx); got == nil {
		t.Error("a second concurrent Run: want an error")
	}
	close(sink.stop)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}

	if got := sink.observed("a")[0]; got.err != nil || got.snap != (balancer.Snapshot{Running: 3, Waiting: 1, KVCacheUsage: 0.5}) {
		t.Errorf("a observed %+v", got)
	}
	if got := sink.observed("b")[0]; !errors.Is(got.err, errDown) {
		t.Errorf("b observed err %v, want %v", got.err, errDown)
	}
	if got := fake.LastAPIKey("http://a"); got != "sk-a" {
		t.Errorf("a scraped with API key %q, want sk-a", got)
	}
	sink.mu.Lock()
	models := sink.models
	sink.mu.Unlock()
	// Models are fetched once (unchanged within ModelsInterval), never for a
	// failing replica nor for one whose models were declared.
	wantModels := map[string][][]string{"a": {{"qwen"}}, "d": {{"m1", "m2"}}}
	if d := cmp.Diff(wantModels, models); d != "" {
		t.Errorf("SetModels calls (-want +got):\n%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(gotTrs) == 0 || gotTrs[0] != tr {
		t.Errorf("OnTransitions got %v, want b's transitions", gotTrs)
	}
	if scrapes["a"] < 6 || failures["a"] != 0 || failures["b"] != scrapes["b"] || scrapes["b"] < 3 {
		t.Errorf("OnScrape counts: scrapes %v, failures %v", scrapes, failures)
	}
	// OnResult sees successful scrapes only.
	if results["a"] < 6 || results["b"] != 0 {
		t.Errorf("OnResult counts %v, want a's successes and none of b's failures", results)
	}
	if got := s.Targets(); len(got) != 3 || got[0].Name != "a" || got[2].Name != "d" {
		t.Errorf("Targets() = %+v, want a, c, d", got)
	}
}

func TestScraperModelsRefresh(t *testing.T) {
	fake := NewFake()
	fake.Set("http://a", Result{}, nil)
	fake.SetModels("http://a", nil, errors.New("boom"))
	sink := newSink(0)
	// ModelsInterval below the scrape interval: every scrape refreshes.
	s := New(fake, sink, Options{Interval: time.Millisecond, ModelsInterval: time.Nanosecond, Logger: quiet})
	if err := s.Add(Target{Name: "a", URL: "http://a"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	sink.waitFor(t, "a", 2) // a failing /v1/models is retried, not reported
	fake.SetModels("http://a", []string{"x"}, nil)
	sink.waitFor(t, "a", 3)
	fake.SetModels("http://a", []string{"x", "y"}, nil)
	sink.waitFor(t, "a", 3)
	close(sink.stop)
	cancel()
	<-done
	sink.mu.Lock()
	defer sink.mu.Unlock()
	if d := cmp.Diff([][]string{{"x"}, {"x", "y"}}, sink.models["a"]); d != "" {
		t.Errorf("SetModels calls (-want +got):\n%s", d)
	}
}

func TestScraperAddValidates(t *testing.T) {
	s := New(NewFake(), newSink(0), Options{})
	for _, tg := range []Target{{URL: "http://a"}, {Name: "a"}} {
		if err := s.Add(tg); err == nil {
			t.Errorf("Add(%+v): want an error", tg)
		}
	}
	// A Fetcher that cannot check liveness cannot scrape a replica without
	// metrics: refused when added, not failing every scrape later.
	s = New(fetchOnly{NewFake()}, newSink(0), Options{})
	if err := s.Add(Target{Name: "a", URL: "http://a", LivenessOnly: true}); err == nil {
		t.Error("Add(LivenessOnly) with a Fetcher without CheckLive: want an error")
	}
}

// fetchOnly hides every method of its Fetcher but Fetch.
type fetchOnly struct{ Fetcher }

// TestScraperLivenessOnly: a replica without Prometheus metrics is scraped
// with CheckLive, never Fetch, with its API key; a live replica is a good
// scrape with an empty Snapshot (its models are still learned), a dead one
// a failed scrape.
func TestScraperLivenessOnly(t *testing.T) {
	fake := NewFake()
	fake.SetLive("http://plain", nil)
	fake.SetModels("http://plain", []string{"llama3"}, nil)
	errDown := errors.New("connection refused")
	fake.SetLive("http://down", errDown)
	sink := newSink(4096)
	var mu sync.Mutex
	results := map[string][]Result{}
	s := New(fake, sink, Options{Interval: time.Millisecond, Logger: quiet,
		OnResult: func(name string, res Result, _ time.Time) {
			mu.Lock()
			defer mu.Unlock()
			results[name] = append(results[name], res)
		}})
	for _, tg := range []Target{
		{Name: "plain", URL: "http://plain", APIKey: "sk-plain", LivenessOnly: true},
		{Name: "down", URL: "http://down", LivenessOnly: true},
	} {
		if err := s.Add(tg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	sink.waitFor(t, "plain", 2)
	sink.waitFor(t, "down", 2)
	close(sink.stop)
	cancel()
	<-done

	for _, got := range sink.observed("plain") {
		if got.err != nil || got.snap != (balancer.Snapshot{}) {
			t.Errorf("plain observed %+v, want an empty Snapshot and no error", got)
		}
	}
	if got := sink.observed("down")[0]; !errors.Is(got.err, errDown) {
		t.Errorf("down observed err %v, want %v", got.err, errDown)
	}
	if fake.Calls("http://plain") != 0 || fake.Calls("http://down") != 0 {
		t.Errorf("Fetch called for liveness-only replicas (%d, %d times)", fake.Calls("http://plain"), fake.Calls("http://down"))
	}
	if fake.LiveChecks("http://plain") < 2 || fake.LastAPIKey("http://plain") != "sk-plain" {
		t.Errorf("plain: %d liveness checks with key %q, want >= 2 with sk-plain", fake.LiveChecks("http://plain"), fake.LastAPIKey("http://plain"))
	}
	sink.mu.Lock()
	models := sink.models
	sink.mu.Unlock()
	if d := cmp.Diff(map[string][][]string{"plain": {{"llama3"}}}, models); d != "" {
		t.Errorf("SetModels calls (-want +got):\n%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(results["plain"]) < 2 || results["plain"][0] != (Result{}) || len(results["down"]) != 0 {
		t.Errorf("OnResult: %+v, want empty results for plain only", results)
	}
}

// The loop over real HTTP: an httptest vLLM with an API key, a dead one, and
// one without /metrics scraped for liveness only.
func TestScraperHTTP(t *testing.T) {
	var mu sync.Mutex
	var auth []string
	live := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		auth = append(auth, r.Header.Get("Authorization"))
		mu.Unlock()
		route(map[string]string{"/metrics": metricsEngines, "/v1/models": `{"object":"list","data":[{"id":"a"},{"id":"b"}]}`})(w, r)
	}))
	defer live.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	plain := httptest.NewServer(route(map[string]string{"/v1/models": `{"object":"list","data":[{"id":"llama3"}]}`}))
	defer plain.Close()

	sink := newSink(4096)
	s := New(NewHTTPFetcher(HTTPOptions{Timeout: 5 * time.Second}), sink, Options{Interval: time.Millisecond, Logger: quiet})
	for _, tg := range []Target{{Name: "live", URL: live.URL, APIKey: "sk-live"}, {Name: "dead", URL: dead.URL},
		{Name: "plain", URL: plain.URL, LivenessOnly: true}} {
		if err := s.Add(tg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	sink.waitFor(t, "live", 2)
	sink.waitFor(t, "dead", 2)
	sink.waitFor(t, "plain", 2)
	close(sink.stop)
	cancel()
	<-done

	if got := sink.observed("live")[0]; got.err != nil || got.snap != (balancer.Snapshot{Running: 8, Waiting: 7, KVCacheUsage: 0.4}) {
		t.Errorf("live observed %+v", got)
	}
	if got := sink.observed("plain")[0]; got.err != nil || got.snap != (balancer.Snapshot{}) {
		t.Errorf("plain (no /metrics, liveness only) observed %+v, want a good scrape", got)
	}
	if got := sink.observed("dead")[0]; got.err == nil {
		t.Error("dead replica: want a scrape error")
	}
	sink.mu.Lock()
	models := sink.models["live"]
	sink.mu.Unlock()
	if d := cmp.Diff([][]string{{"a", "b"}}, models); d != "" {
		t.Errorf("models (-want +got):\n%s", d)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, a := range auth {
		if a != "Bearer sk-live" {
			t.Errorf("scrape sent Authorization %q, want the replica's key", a)
		}
	}
}

// soonSink is a recordingSink that asks for follow-up scrapes of "a".
type soonSink struct{ *recordingSink }

func (soonSink) ScrapeSoon(name string, _ time.Time) bool { return name == "a" }

// TestScraperFollowUp: a sink that asks for a scrape soon (the balancer
// while a replica of unknown limit fills and requests are contested) gets
// the next one after FollowUp, not after the interval; other replicas keep
// the interval.
func TestScraperFollowUp(t *testing.T) {
	fake := NewFake()
	fake.Set("http://a", Result{Snapshot: balancer.Snapshot{Running: 3}}, nil)
	fake.Set("http://b", Result{}, nil)
	sink := soonSink{newSink(4096)}
	s := New(fake, sink, Options{Interval: time.Hour, FollowUp: time.Millisecond, Logger: quiet})
	for _, tg := range []Target{{Name: "a", URL: "http://a", Models: []string{"m"}}, {Name: "b", URL: "http://b", Models: []string{"m"}}} {
		if err := s.Add(tg); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	sink.waitFor(t, "a", 3) // with an hour's interval, only follow-ups come this soon
	cancel()
	<-done
	if n := len(sink.observed("b")); n > 1 {
		t.Errorf("b scraped %d times, want at most once (its interval is an hour)", n)
	}
}
