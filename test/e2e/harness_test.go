//go:build e2e

// Package e2e proves llmlb's behavioural guarantees (docs/GUARANTEES.md) end
// to end: the `llmlb` binary is built once, `llmlb sim` and `llmlb serve` run
// as separate processes on free loopback ports, faults are injected through
// the simulator's control endpoint, and the tests assert on what clients saw
// and on /admin/* and /metrics. Run: go test -tags e2e -race ./test/e2e
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/llmlb/llmlb/internal/testutil/syncbuf"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// binary is the llmlb binary TestMain built.
var binary string

// TestMain builds ./cmd/llmlb once (LLMLB_E2E_RACE=1 builds it with -race).
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "llmlb-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	root, err := moduleRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	binary = filepath.Join(dir, "llmlb")
	args := []string{"build", "-o", binary}
	if os.Getenv("LLMLB_E2E_RACE") == "1" {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, "./cmd/llmlb")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go build ./cmd/llmlb: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside the llmlb module")
	}
	return filepath.Dir(mod), nil
}

// httpClient is the tests' client: its own transport, no overall timeout
// (streams are long; each call carries a context).
var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}}

// syncBuffer is a goroutine-safe buffer (package syncbuf).
type syncBuffer = syncbuf.Buffer

// proc is a child process in its own process group.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // Wait's result, valid after done
}

// startProc starts the binary with args; the test's cleanup kills its
// process group and, if the test failed, prints the tail of its output.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, args...)
}

// startProcEnv is startProc with extra environment variables (secrets for
// api_key_env) set for this child only.
func startProcEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(binary, args...)
	if len(env) > 0 {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if strings.Contains(p.out.String(), "WARNING: DATA RACE") { // LLMLB_E2E_RACE=1 builds
			t.Errorf("%s reported a data race", name)
		}
		if t.Failed() {
			out := p.out.String()
			if len(out) > 6000 {
				out = "...\n" + out[len(out)-6000:]
			}
			t.Logf("--- %s output (tail) ---\n%s", name, out)
		}
	})
	return p
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process group and waits for the process.
func (p *proc) kill() {
	if !p.exited() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
}

// signal sends sig to the process itself.
func (p *proc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %s to %s: %v", sig, p.name, err)
	}
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(d):
		t.Fatalf("%s did not exit within %v", p.name, d)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("%s: %v", p.name, p.err)
	}
	return 0
}

// freePorts returns a base port such that base..base+n-1 and, with offset >
// 0, base+offset..base+offset+n-1 are free now (listen on :0, close).
func freePorts(t *testing.T, n, offset int) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if base+n+offset >= 65535 {
			continue
		}
		ok := true
		for i := range n {
			if !portFree(base+i) || (offset > 0 && !portFree(base+offset+i)) {
				ok = false
				break
			}
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range found")
	return 0
}

func portFree(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// waitFor polls cond every 25 ms until it returns true or the deadline
// passes; the last message explains a failure. Deadlines are generous: they
// bound a hang, they are not the figure under test.
func waitFor(t *testing.T, d time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	last := ""
	for {
		ok, msg := cond()
		if ok {
			return time.Since(start)
		}
		last = msg
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s: %s", d, what, last)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// --- llmlb sim ---

// simFleet is one `llmlb sim` process with N replicas named sim-1..sim-N.
type simFleet struct {
	p       *proc
	urls    []string // replica i+1's root URL
	control []string // replica i+1's control root (port + 1000)
}

// startSim starts n replicas on consecutive free ports (control on +1000),
// retrying when a port was taken in between, and waits for /health.
func startSim(t *testing.T, n int, extra ...string) *simFleet {
	t.Helper()
	const offset = 1000
	for attempt := 0; ; attempt++ {
		base := freePorts(t, n, offset)
		args := append([]string{"sim", "--listen", fmt.Sprintf("127.0.0.1:%d", base), "--replicas", strconv.Itoa(n),
			"--control-offset", strconv.Itoa(offset), "--log-level", "warn"}, extra...)
		p := startProc(t, "llmlb sim", args...)
		f := &simFleet{p: p}
		for i := range n {
			f.urls = append(f.urls, fmt.Sprintf("http://127.0.0.1:%d", base+i))
			f.control = append(f.control, fmt.Sprintf("http://127.0.0.1:%d", base+offset+i))
		}
		ready := func() bool {
			for _, u := range f.urls {
				if status(u+"/health") != http.StatusOK {
					return false
				}
			}
			return true
		}
		deadline := time.Now().Add(20 * time.Second)
		for !p.exited() && !ready() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !p.exited() && ready() {
			return f
		}
		if p.exited() && attempt < 5 && strings.Contains(p.out.String(), "address already in use") {
			continue // a port was taken between the probe and the bind
		}
		p.kill()
		t.Fatalf("llmlb sim did not become ready:\n%s", p.out.String())
	}
}

// name is replica i's name (0-based index).
func simName(i int) string { return fmt.Sprintf("sim-%d", i+1) }

// fault sets replica i's fault through its control port, e.g. `{"mode":"refuse"}`.
func (f *simFleet) fault(t *testing.T, i int, faultJSON string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.control[i]+"/sim/fault", strings.NewReader(faultJSON))
	req.Header.Set("Content-Type", "application/json")
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("set fault on %s: %v", simName(i), err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("set fault %s on %s: %d %s", faultJSON, simName(i), res.StatusCode, body)
	}
}

// vllmCounter sums a vLLM counter/gauge over labels on replica i's /metrics
// (-1 when the replica does not answer).
func (f *simFleet) vllmMetric(i int, name string) float64 {
	mfs, err := scrapeMetrics(f.urls[i] + "/metrics")
	if err != nil {
		return -1
	}
	return sumMetric(mfs, name, nil)
}

// requestsDone is replica i's finished-request count (all finish reasons).
func (f *simFleet) requestsDone(i int) float64 { return f.vllmMetric(i, "vllm:request_success_total") }

// replicasYAML lists the fleet's replicas (the first n, or all for n <= 0).
func (f *simFleet) replicasYAML(n int) string {
	if n <= 0 || n > len(f.urls) {
		n = len(f.urls)
	}
	var b strings.Builder
	b.WriteString("replicas:\n")
	for i := range n {
		fmt.Fprintf(&b, "  - name: %s\n    url: %s\n    models: [sim-model]\n", simName(i), f.urls[i])
	}
	return b.String()
}

// --- llmlb serve ---

// serveProc is one `llmlb serve` process.
type serveProc struct {
	p                  *proc
	proxy, admin       string // base URLs
	cfgPath            string
	proxyAddr, adminAd string
}

// startServe writes cfg (YAML without listen/admin_listen, which it adds on
// free ports) and starts `llmlb serve --config`, waiting for /healthz. It
// retries when a port was taken in between.
func startServe(t *testing.T, cfg string, env ...string) *serveProc {
	t.Helper()
	for attempt := 0; ; attempt++ {
		pp, ap := freePorts(t, 1, 0), freePorts(t, 1, 0)
		if pp == ap {
			continue
		}
		s := &serveProc{
			proxyAddr: fmt.Sprintf("127.0.0.1:%d", pp),
			adminAd:   fmt.Sprintf("127.0.0.1:%d", ap),
			cfgPath:   filepath.Join(t.TempDir(), "llmlb.yaml"),
		}
		s.proxy, s.admin = "http://"+s.proxyAddr, "http://"+s.adminAd
		s.writeConfig(t, cfg)
		cmd := []string{"serve", "--config", s.cfgPath}
		s.p = startProcEnv(t, "llmlb serve", env, cmd...)
		deadline := time.Now().Add(20 * time.Second)
		for !s.p.exited() && status(s.admin+"/healthz") != http.StatusOK && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !s.p.exited() && status(s.admin+"/healthz") == http.StatusOK {
			return s
		}
		if s.p.exited() && attempt < 5 && strings.Contains(s.p.out.String(), "address already in use") {
			continue
		}
		s.p.kill()
		t.Fatalf("llmlb serve did not start:\n%s", s.p.out.String())
	}
}

// writeConfig (re)writes the config file with the same listen addresses.
func (s *serveProc) writeConfig(t *testing.T, cfg string) {
	t.Helper()
	full := fmt.Sprintf("listen: %s\nadmin_listen: %s\n%s", s.proxyAddr, s.adminAd, cfg)
	if err := os.WriteFile(s.cfgPath, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
}

// replicaStatus mirrors the fields of GET /admin/replicas the tests read.
type replicaStatus struct {
	Name             string  `json:"name"`
	URL              string  `json:"url"`
	State            string  `json:"state"`
	Draining         bool    `json:"draining"`
	EffectiveRunning float64 `json:"effective_running"`
	EffectiveWaiting float64 `json:"effective_waiting"`
	ScrapedRunning   float64 `json:"scraped_running"`
	ScrapedWaiting   float64 `json:"scraped_waiting"`
	InFlight         int     `json:"in_flight"`
	CooldownSeconds  float64 `json:"cooldown_seconds"`
	Ejections        int     `json:"ejections"`
	Requests         uint64  `json:"requests"`
	LastScrapeOK     bool    `json:"last_scrape_ok"`
}

type pinStatus struct {
	Kind    string `json:"kind"`
	Key     string `json:"key"`
	Replica string `json:"replica"`
}

type alertStatus struct {
	Name    string `json:"name"`
	Replica string `json:"replica"`
	Message string `json:"message"`
}

func (s *serveProc) replicas(t *testing.T) map[string]replicaStatus {
	t.Helper()
	var list []replicaStatus
	s.getJSON(t, "/admin/replicas", &list)
	m := make(map[string]replicaStatus, len(list))
	for _, r := range list {
		m[r.Name] = r
	}
	return m
}

func (s *serveProc) pins(t *testing.T) []pinStatus {
	t.Helper()
	var list []pinStatus
	s.getJSON(t, "/admin/pins?limit=0", &list)
	return list
}

func (s *serveProc) alerts(t *testing.T) []alertStatus {
	t.Helper()
	var list []alertStatus
	s.getJSON(t, "/admin/alerts", &list)
	return list
}

func (s *serveProc) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.admin+path, nil)
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("GET %s: %d %s", path, res.StatusCode, b)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
}

// metrics parses llmlb's /metrics.
func (s *serveProc) metrics(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := scrapeMetrics(s.admin + "/metrics")
	if err != nil {
		t.Fatalf("llmlb /metrics: %v", err)
	}
	return mfs
}

// waitState waits until replica name is in state and returns how long it took.
func (s *serveProc) waitState(t *testing.T, name, state string, d time.Duration) time.Duration {
	t.Helper()
	return waitFor(t, d, name+" "+state, func() (bool, string) {
		r := s.replicas(t)[name]
		return r.State == state, fmt.Sprintf("%s is %q", name, r.State)
	})
}

// waitAllLive waits until replicas sim-1..sim-n are LIVE and have been
// scraped successfully (a replica starts LIVE before its first scrape; a
// fault injected before that scrape would race with it).
func (s *serveProc) waitAllLive(t *testing.T, n int) {
	t.Helper()
	waitFor(t, 20*time.Second, "all replicas LIVE and scraped", func() (bool, string) {
		rs := s.replicas(t)
		for i := range n {
			if r := rs[simName(i)]; r.State != "LIVE" || !r.LastScrapeOK {
				return false, fmt.Sprintf("%v", rs)
			}
		}
		return true, ""
	})
}

func scrapeMetrics(url string) (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %d", res.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(res.Body)
}

// sumMetric sums the samples of family name whose labels include match.
func sumMetric(mfs map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	mf := mfs[name]
	if mf == nil {
		return 0
	}
	total := 0.0
	for _, m := range mf.GetMetric() {
		if !labelsMatch(m, match) {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Untyped != nil:
			total += m.GetUntyped().GetValue()
		case m.Histogram != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

func labelsMatch(m *dto.Metric, match map[string]string) bool {
	for k, v := range match {
		found := false
		for _, l := range m.GetLabel() {
			if l.GetName() == k && l.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// status is a GET's status code (0 when it failed).
func status(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	res, err := httpClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// --- clients ---

// chatReq is one chat completion a test sends through llmlb.
type chatReq struct {
	Session   string // X-Session-Id ("" = none)
	System    string // system prompt ("" = none)
	User      string
	MaxTokens int
	Stream    bool
	Header    http.Header // extra headers
	// OnFirstByte, if set, is called once when the first content chunk arrives.
	OnFirstByte func()
	// OnStart, if set, is called then too, with the X-LLMLB-Replica header.
	OnStart func(replica string)
}

// reply is what one client saw.
type reply struct {
	Status     int
	Replica    string // X-LLMLB-Replica
	Route      string // X-LLMLB-Route
	Started    bool   // a streamed content chunk arrived
	Done       bool   // data: [DONE] (stream) or a complete JSON body
	ErrorEvent bool   // the stream ended with data: {"error":...}
	Err        error  // transport error or a stream that ended without [DONE] or error event
	Body       string // non-stream body, or the error event
}

// ok says whether the request completed normally.
func (r reply) ok() bool { return r.Err == nil && r.Status == http.StatusOK && r.Done && !r.ErrorEvent }

func (s *serveProc) chat(ctx context.Context, c chatReq) reply {
	msgs := []map[string]string{}
	if c.System != "" {
		msgs = append(msgs, map[string]string{"role": "system", "content": c.System})
	}
	user := c.User
	if user == "" {
		user = "hello"
	}
	msgs = append(msgs, map[string]string{"role": "user", "content": user})
	body := map[string]any{"model": "sim-model", "messages": msgs, "stream": c.Stream}
	if c.MaxTokens > 0 {
		body["max_tokens"] = c.MaxTokens
	}
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.proxy+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return reply{Err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	if c.Session != "" {
		req.Header.Set("X-Session-Id", c.Session)
	}
	for k, vs := range c.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return reply{Err: err}
	}
	defer res.Body.Close()
	r := reply{Status: res.StatusCode, Replica: res.Header.Get("X-LLMLB-Replica"), Route: res.Header.Get("X-LLMLB-Route")}
	if !c.Stream || res.StatusCode != http.StatusOK || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/event-stream") {
		data, err := io.ReadAll(res.Body)
		r.Body = string(data)
		if err != nil {
			r.Err = err
		} else if res.StatusCode == http.StatusOK && json.Valid(data) {
			r.Done = true
		}
		return r
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		switch {
		case data == "[DONE]":
			r.Done = true
		case strings.HasPrefix(data, `{"error"`):
			r.ErrorEvent, r.Body = true, data
		default:
			if !r.Started {
				r.Started = true
				if c.OnFirstByte != nil {
					c.OnFirstByte()
				}
				if c.OnStart != nil {
					c.OnStart(r.Replica)
				}
			}
		}
	}
	if err := sc.Err(); err != nil && !r.ErrorEvent {
		r.Err = err
	} else if !r.Done && !r.ErrorEvent {
		r.Err = errors.New("stream ended without [DONE] or an error event")
	}
	return r
}

// tally counts replies by replica.
func tally(rs []reply) map[string]int {
	m := map[string]int{}
	for _, r := range rs {
		m[r.Replica]++
	}
	return m
}

// yamlTimers is the shortened-timer part of most scenarios' configs.
func yamlTimers(scrapeInterval, scrapeTimeout, baseCooldown, maxCooldown, probingWindow time.Duration) string {
	return fmt.Sprintf(`scrape:
  interval: %s
  timeout: %s
routing:
  health:
    base_cooldown: %s
    max_cooldown: %s
    probing_window: %s
`, scrapeInterval, scrapeTimeout, baseCooldown, maxCooldown, probingWindow)
}
