package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	wire "github.com/llmlb/llmlb/internal/openai"
	"github.com/llmlb/llmlb/internal/proxy"
	"github.com/llmlb/llmlb/internal/scrape"
	"github.com/llmlb/llmlb/internal/simreplica"
)

const model = "sim-model"

// waitFor is how long a test waits for an asynchronous state (a scrape, an
// ejection, a release). It is a generous deadline, not a timing assertion.
const waitFor = 20 * time.Second

// testConfig is a serve config on loopback ports with the default settings.
func testConfig(urls ...string) config.Config {
	cfg := config.Default()
	cfg.Proxy.FirstByteTimeout = 30 * time.Second
	cfg.Server.ShutdownTimeout = 30 * time.Second
	// A scrape that times out on a loaded test machine ejects a replica;
	// make that cost a second, not a 30 s cooldown.
	cfg.Scrape.Interval, cfg.Scrape.Timeout = time.Second, time.Second
	cfg.Routing.Health.BaseCooldown = 200 * time.Millisecond
	cfg.Routing.Health.ProbingWindow = 200 * time.Millisecond
	for i, u := range urls {
		cfg.Replicas = append(cfg.Replicas, config.Replica{Name: fmt.Sprintf("sim-%d", i+1), URL: u})
	}
	return cfg
}

// env is a simulated fleet with a running llmlb in front of it.
type env struct {
	t     *testing.T
	fleet *simreplica.Fleet
	srv   *Server
	stop  context.CancelFunc
	done  chan error
	proxy string // http://addr
	admin string
	http  *http.Client
}

// fastHealth scrapes often and forgives quickly, so that a scrape that times
// out on a loaded machine costs a fraction of a second, not a 30 s cooldown.
func fastHealth(c *config.Config) {
	c.Scrape.Interval = 200 * time.Millisecond
	c.Scrape.Timeout = 200 * time.Millisecond
}

// idleFleet is a scrape.Fake that reports every replica idle and serving
// the model, whatever it really does: the core then knows only what the
// proxy itself sees (reservations, failed attempts).
func idleFleet() (*scrape.Fake, func(*config.Config)) {
	f := scrape.NewFake()
	return f, func(c *config.Config) {
		for _, r := range c.Replicas {
			f.Set(r.URL, scrape.Result{}, nil)
			f.SetModels(r.URL, []string{model}, nil)
		}
	}
}

func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func testLogger() *slog.Logger {
	if os.Getenv("LLMLB_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// start runs n simulated replicas and llmlb; tweak adjusts the config.
func start(t *testing.T, n int, tweak func(*config.Config), opts ...Option) *env {
	t.Helper()
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: n, Model: model, Seed: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	return startOn(t, fleet, tweak, opts...)
}

// startOn runs llmlb in front of an existing fleet (several instances may
// share one).
func startOn(t *testing.T, fleet *simreplica.Fleet, tweak func(*config.Config), opts ...Option) *env {
	t.Helper()
	e := startURLs(t, fleet.URLs(), testLogger(), tweak, opts...)
	e.fleet = fleet
	return e
}

// startURLs runs llmlb in front of the replicas at urls (named sim-1,
// sim-2, ...), logging to logger.
func startURLs(t *testing.T, urls []string, logger *slog.Logger, tweak func(*config.Config), opts ...Option) *env {
	t.Helper()
	n := len(urls)
	cfg := testConfig(urls...)
	if tweak != nil {
		tweak(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := New(cfg, logger, opts...)
	if err != nil {
		t.Fatal(err)
	}
	// Loopback listeners on free ports (config.Validate rejects two equal
	// ":0" addresses, so they are bound here rather than configured).
	srv.UseListeners(listen(t), listen(t))
	ctx, cancel := context.WithCancel(context.Background())
	e := &env{t: t, srv: srv, stop: cancel, done: make(chan error, 1),
		proxy: "http://" + srv.ProxyAddr(), admin: "http://" + srv.AdminAddr(),
		http: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	go func() { e.done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-e.done
	})
	// Ready once the first scrapes have told the core the replicas are up
	// and which model they serve.
	e.waitReplicas("every replica LIVE and serving the model", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.State != "LIVE" || len(r.Models) == 0 {
				return false
			}
		}
		return len(rs) == n
	})
	return e
}

func (e *env) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(e.proxy+"/v1/"), option.WithAPIKey("sk-test"),
		option.WithHTTPClient(e.http), option.WithMaxRetries(0))
}

// replicas reads GET /admin/replicas.
func (e *env) replicas() []balancer.ReplicaStatus {
	e.t.Helper()
	res, err := e.http.Get(e.admin + "/admin/replicas")
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	var rs []balancer.ReplicaStatus
	if err := json.NewDecoder(res.Body).Decode(&rs); err != nil {
		e.t.Fatal(err)
	}
	return rs
}

// waitReplicas polls /admin/replicas until ok holds or the deadline passes.
func (e *env) waitReplicas(what string, ok func([]balancer.ReplicaStatus) bool) {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		rs := e.replicas()
		if ok(rs) {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s; replicas: %+v", what, rs)
		}
		<-tick.C
	}
}

func totalInFlight(rs []balancer.ReplicaStatus) int {
	n := 0
	for _, r := range rs {
		n += r.InFlight
	}
	return n
}

// chat sends a non-streaming chat completion and returns the status and the
// replica that served it.
func (e *env) chat(body string, hdr map[string]string) (int, string, []byte) {
	e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.proxy+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := e.http.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get(proxy.HeaderReplica), b
}

func chatBody(content string, maxTokens int) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`, model, maxTokens, content)
}

func TestSessionStaysOnOneReplica(t *testing.T) {
	e := start(t, 4, nil)
	first := ""
	for i := range 6 {
		code, rep, body := e.chat(chatBody(fmt.Sprintf("turn %d", i), 4), map[string]string{"x-session-id": "s-1"})
		if code != http.StatusOK {
			t.Fatalf("turn %d: %d %s", i, code, body)
		}
		if first == "" {
			first = rep
		}
		if rep != first {
			t.Fatalf("turn %d went to %s, the session is pinned to %s", i, rep, first)
		}
	}
}

// stream opens a streaming completion and returns once its first chunk
// arrived; the returned func reads the rest and reports the stream's error.
func (e *env) stream(ctx context.Context, maxTokens int, session string) (replica string, finish func() (int, error)) {
	e.t.Helper()
	var res *http.Response
	opts := []option.RequestOption{option.WithResponseInto(&res)}
	if session != "" {
		opts = append(opts, option.WithHeader("x-session-id", session))
	}
	c := e.client()
	s := c.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:     model,
		MaxTokens: openai.Int(int64(maxTokens)),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("tell me a long story " + session)},
	}, opts...)
	if !s.Next() {
		e.t.Fatalf("stream ended before its first chunk: %v", s.Err())
	}
	chunks := 1
	return res.Header.Get(proxy.HeaderReplica), func() (int, error) {
		defer s.Close()
		for s.Next() {
			chunks++
		}
		return chunks, s.Err()
	}
}

func TestNewSessionGoesToIdleReplica(t *testing.T) {
	e := start(t, 4, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busy, _ := e.stream(ctx, 2000, "long-1")
	for i := range 3 {
		code, rep, body := e.chat(chatBody("hello", 2), map[string]string{"x-session-id": fmt.Sprintf("new-%d", i)})
		if code != http.StatusOK {
			t.Fatalf("%d %s", code, body)
		}
		if rep == busy {
			t.Errorf("new session %d went to %s, which is busy with a long stream", i, rep)
		}
	}
}

func TestEightRequestsOnFourIdleReplicasLandTwoEach(t *testing.T) {
	// Scrapes report idle replicas: the count must come from the
	// balancer's own reservations, made atomically at selection.
	fake, setIdle := idleFleet()
	e := start(t, 4, setIdle, WithFetcher(fake))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	per := map[string]int{}
	var got, wg sync.WaitGroup
	got.Add(8)
	hold := make(chan struct{})
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rep, _ := e.stream(ctx, 2000, fmt.Sprintf("burst-%d", i))
			mu.Lock()
			per[rep]++
			mu.Unlock()
			got.Done()
			<-hold // keep the stream in flight until all 8 are placed
		}()
	}
	got.Wait()
	close(hold)
	cancel()
	wg.Wait()
	if len(per) != 4 {
		t.Fatalf("requests per replica %v: want all 4 replicas used", per)
	}
	for rep, n := range per {
		if n != 2 {
			t.Errorf("replica %s got %d of 8, want 2 (all: %v)", rep, n, per)
		}
	}
}

func TestKilledReplicaIsEjectedAndGetsNoTraffic(t *testing.T) {
	e := start(t, 4, func(c *config.Config) {
		fastHealth(c)
	})
	victim := e.fleet.Replicas[1]
	killed := time.Now()
	if err := victim.SetFault(simreplica.Fault{Mode: simreplica.Refuse}); err != nil {
		t.Fatal(err)
	}
	e.waitReplicas(victim.Name()+" EJECTED", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.Name == victim.Name() {
				return r.State == "EJECTED"
			}
		}
		return false
	})
	// A figure for the record, not an assertion (interval 200 ms + timeout 200 ms).
	t.Logf("EJECTED %v after the kill", time.Since(killed).Round(time.Millisecond))
	for i := range 12 {
		code, rep, body := e.chat(chatBody("after the kill", 2), map[string]string{"x-session-id": fmt.Sprintf("k-%d", i)})
		if code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
		if rep == victim.Name() {
			t.Errorf("request %d went to the ejected replica %s", i, rep)
		}
	}
}

func TestRefusedConnectionSucceedsOnAnotherReplica(t *testing.T) {
	overBoth(t, testRefusedConnectionSucceedsOnAnotherReplica)
}

func testRefusedConnectionSucceedsOnAnotherReplica(t *testing.T, start starter) {
	// Scrapes keep saying the refusing replica is fine: only failover
	// saves these requests.
	fake, setIdle := idleFleet()
	e := start(t, 3, setIdle, WithFetcher(fake))
	victim := e.fleet.Replicas[0]
	if err := victim.SetFault(simreplica.Fault{Mode: simreplica.Refuse}); err != nil {
		t.Fatal(err)
	}
	for i := range 6 {
		code, rep, body := e.chat(chatBody("hi", 2), nil)
		if code != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
		if rep == victim.Name() {
			t.Errorf("request %d answered by the refusing replica", i)
		}
	}
}

func TestClientDisconnectMidStreamReleases(t *testing.T) {
	overBoth(t, testClientDisconnectMidStreamReleases)
}

func testClientDisconnectMidStreamReleases(t *testing.T, start starter) {
	e := start(t, 2, nil)
	ctx, cancel := context.WithCancel(context.Background())
	_, finish := e.stream(ctx, 5000, "gone")
	if n := totalInFlight(e.replicas()); n != 1 {
		t.Errorf("in-flight %d during the stream, want 1", n)
	}
	cancel()
	finish()
	e.waitReplicas("in-flight back to 0", func(rs []balancer.ReplicaStatus) bool { return totalInFlight(rs) == 0 })
}

func TestShutdownLetsStreamsFinish(t *testing.T) {
	e := start(t, 2, nil)
	const streams = 3
	finishes := make([]func() (int, error), streams)
	for i := range finishes {
		_, finishes[i] = e.stream(context.Background(), 150, fmt.Sprintf("drain-%d", i))
	}
	e.stop() // SIGTERM equivalent
	// While the streams drain, the admin listener says so.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(waitFor); ; <-tick.C {
		res, err := e.http.Get(e.admin + "/readyz")
		if err != nil {
			t.Fatalf("admin listener gone while streams drain: %v", err)
		}
		res.Body.Close()
		if res.StatusCode == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("/readyz never reported the drain")
		}
	}
	for i, finish := range finishes {
		chunks, err := finish()
		if err != nil {
			t.Errorf("stream %d broken by the shutdown after %d chunks: %v", i, chunks, err)
		}
	}
	if err := <-e.done; err != nil {
		t.Errorf("Run returned %v, want nil", err)
	}
	e.done <- nil // for the cleanup
	if _, err := e.http.Get(e.proxy + "/v1/models"); err == nil {
		t.Error("the proxy still accepts requests after the drain")
	}
}

func TestBadInput(t *testing.T) { overBoth(t, testBadInput) }

func testBadInput(t *testing.T, start starter) {
	e := start(t, 2, func(c *config.Config) { c.Proxy.MaxBodyBytes = 4096 })
	tests := []struct {
		name     string
		body     io.Reader
		wantCode int
		wantErr  string
	}{
		{"malformed JSON", strings.NewReader(`{"model":`), 400, wire.CodeInvalidJSON},
		{"body over the limit", bytes.NewReader(bytes.Repeat([]byte("x"), 1<<20)), 413, wire.CodeTooLarge},
		{"body over the limit, chunked", io.MultiReader(strings.NewReader(`{"model":"`), &endless{}), 413, wire.CodeTooLarge},
		{"unknown model", strings.NewReader(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`), 404, wire.CodeModelNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := e.http.Post(e.proxy+"/v1/chat/completions", "application/json", tt.body)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var eb wire.ErrorBody
			if err := json.NewDecoder(res.Body).Decode(&eb); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != tt.wantCode || eb.Error.Code != tt.wantErr {
				t.Errorf("got %d %+v, want %d %s", res.StatusCode, eb.Error, tt.wantCode, tt.wantErr)
			}
		})
	}
}

// endless is a body that never ends.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

func TestAllReplicasDownIs503(t *testing.T) {
	e := start(t, 2, func(c *config.Config) {
		fastHealth(c)
	})
	for _, r := range e.fleet.Replicas {
		if err := r.SetFault(simreplica.Fault{Mode: simreplica.Refuse}); err != nil {
			t.Fatal(err)
		}
	}
	e.waitReplicas("every replica EJECTED", func(rs []balancer.ReplicaStatus) bool {
		for _, r := range rs {
			if r.State != "EJECTED" {
				return false
			}
		}
		return true
	})
	code, _, body := e.chat(chatBody("anyone?", 2), nil)
	var eb wire.ErrorBody
	_ = json.Unmarshal(body, &eb)
	if code != http.StatusServiceUnavailable || eb.Error.Code != wire.CodeNoHealthyInstances {
		t.Errorf("got %d %s, want 503 no_healthy_instances", code, body)
	}
}

func TestModelsWithTheOpenAIClient(t *testing.T) {
	e := start(t, 2, nil)
	c := e.client()
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != model {
		t.Errorf("models %+v, want [%s]", page.Data, model)
	}
	comp, err := c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model:     model,
		MaxTokens: openai.Int(3),
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(comp.Choices) != 1 {
		t.Errorf("choices %+v", comp.Choices)
	}
}

func TestAdminMutations(t *testing.T) {
	extra, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: 1, Model: model, NamePrefix: "extra-", Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	e := start(t, 1, func(c *config.Config) { c.AdminToken = "s3cret" })
	do := func(method, path, token, body string) int {
		req, _ := http.NewRequest(method, e.admin+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	add := fmt.Sprintf(`{"name":"extra","url":%q,"models":[%q]}`, extra.URLs()[0], model)
	steps := []struct {
		name         string
		method, path string
		token, body  string
		want         int
	}{
		{"add without a token", "POST", "/admin/replicas", "", add, 401},
		{"add with a wrong token", "POST", "/admin/replicas", "nope", add, 401},
		{"add", "POST", "/admin/replicas", "s3cret", add, 201},
		{"add twice", "POST", "/admin/replicas", "s3cret", add, 409},
		{"add with a bad url", "POST", "/admin/replicas", "s3cret", `{"url":"ftp://x"}`, 400},
		{"drain", "POST", "/admin/replicas/extra/drain", "s3cret", "", 200},
		{"undrain", "POST", "/admin/replicas/extra/undrain", "s3cret", "", 200},
		{"drain unknown", "POST", "/admin/replicas/ghost/drain", "s3cret", "", 404},
		{"remove without a token", "DELETE", "/admin/replicas/extra", "", "", 401},
		{"remove", "DELETE", "/admin/replicas/extra", "s3cret", "", 200},
		{"remove again", "DELETE", "/admin/replicas/extra", "s3cret", "", 404},
		{"pins list session ids: token", "GET", "/admin/pins", "", "", 401},
		{"pins with the token", "GET", "/admin/pins", "s3cret", "", 200},
		{"replica state needs no token", "GET", "/admin/replicas", "", "", 200},
		{"alerts", "GET", "/admin/alerts", "", "", 200},
		{"healthz", "GET", "/healthz", "", "", 200},
		{"readyz", "GET", "/readyz", "", "", 200},
		{"metrics", "GET", "/metrics", "", "", 200},
		{"the dashboard", "GET", "/ui", "", "", 200},
	}
	for _, s := range steps {
		if got := do(s.method, s.path, s.token, s.body); got != s.want {
			t.Errorf("%s: %s %s = %d, want %d", s.name, s.method, s.path, got, s.want)
		}
	}
}

func TestMetricsExposeOurNames(t *testing.T) {
	e := start(t, 2, nil)
	if code, _, body := e.chat(chatBody("hi", 2), nil); code != 200 {
		t.Fatalf("%d %s", code, body)
	}
	// The request is counted when its handler returns, which may be just
	// after the client has read the answer: wait for the count.
	e.waitMetric(`llmlb_requests_total{code="200"`)
	res, err := e.http.Get(e.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, name := range []string{
		"llmlb_requests_total", "llmlb_replica_in_flight", "llmlb_replica_effective_running",
		"llmlb_replica_state", "llmlb_pins", "llmlb_spills_total", "llmlb_rebinds_total",
		"llmlb_ejections_total", "llmlb_scrapes_total", "llmlb_time_to_first_byte_seconds",
	} {
		if !strings.Contains(string(b), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestStreamBrokenMidwayEndsWithErrorEvent(t *testing.T) {
	overBoth(t, testStreamBrokenMidwayEndsWithErrorEvent)
}

func testStreamBrokenMidwayEndsWithErrorEvent(t *testing.T, start starter) {
	e := start(t, 1, nil)
	if err := e.fleet.Replicas[0].SetFault(simreplica.Fault{Mode: simreplica.Break, AfterTokens: 3}); err != nil {
		t.Fatal(err)
	}
	_, finish := e.stream(context.Background(), 50, "break")
	chunks, err := finish()
	if err == nil || !strings.Contains(err.Error(), "broke") {
		t.Fatalf("after %d chunks the stream ended with %v; want the balancer's error event", chunks, err)
	}
	e.waitReplicas("the broken stream released", func(rs []balancer.ReplicaStatus) bool { return totalInFlight(rs) == 0 })
	e.waitMetric(`llmlb_stream_errors_total{replica="sim-1"} 1`)
}

func TestReplica5xxIsPassedThrough(t *testing.T) {
	e := start(t, 1, nil)
	if err := e.fleet.Replicas[0].SetFault(simreplica.Fault{Mode: simreplica.Error, Status: 500, Rate: 1}); err != nil {
		t.Fatal(err)
	}
	code, rep, body := e.chat(chatBody("hi", 2), nil)
	if code != http.StatusInternalServerError || rep != "sim-1" {
		t.Errorf("got %d from %q (%s), want the replica's own 500 with its name", code, rep, body)
	}
}

// waitMetric polls /metrics until it holds line (a generous deadline).
func (e *env) waitMetric(line string) {
	e.t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var b []byte
	for deadline := time.Now().Add(waitFor); time.Now().Before(deadline); <-tick.C {
		res, err := e.http.Get(e.admin + "/metrics")
		if err != nil {
			e.t.Fatal(err)
		}
		b, _ = io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(b), line) {
			return
		}
	}
	e.t.Fatalf("/metrics never showed %q", line)
}

func TestReloadReplicaList(t *testing.T) {
	e := start(t, 3, nil)
	urls := e.fleet.URLs()
	names := func() []string {
		var out []string
		for _, r := range e.replicas() {
			out = append(out, r.Name)
		}
		return out
	}
	steps := []struct {
		name     string
		adminDel string // removed through the admin API before the reload
		replicas []config.Replica
		want     []string
	}{
		{"drop one", "", []config.Replica{{Name: "sim-1", URL: urls[0]}, {Name: "sim-2", URL: urls[1]}}, []string{"sim-1", "sim-2"}},
		{"add it back under a new name", "", []config.Replica{{Name: "sim-1", URL: urls[0]}, {Name: "sim-2", URL: urls[1]}, {Name: "third", URL: urls[2]}}, []string{"sim-1", "sim-2", "third"}},
		{"move a replica", "", []config.Replica{{Name: "sim-1", URL: urls[2]}, {Name: "sim-2", URL: urls[1]}}, []string{"sim-1", "sim-2"}},
		{"admin removal then reload restores it", "sim-2", []config.Replica{{Name: "sim-1", URL: urls[2]}, {Name: "sim-2", URL: urls[1]}}, []string{"sim-1", "sim-2"}},
	}
	for _, s := range steps {
		if s.adminDel != "" && !(fleet{e.srv}).RemoveReplica(s.adminDel) {
			t.Fatalf("%s: admin removal of %s failed", s.name, s.adminDel)
		}
		if _, _, err := e.srv.Reload(s.replicas); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := names(); !slices.Equal(got, s.want) {
			t.Errorf("%s: replicas %v, want %v", s.name, got, s.want)
		}
	}
	for _, r := range e.replicas() {
		if r.Name == "sim-1" && r.URL != urls[2] {
			t.Errorf("sim-1 still at %s after the move", r.URL)
		}
	}
}
