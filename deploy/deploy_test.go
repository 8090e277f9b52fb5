// Package deploy_test checks the packaging under deploy/: the Dockerfile's
// stages, the systemd unit's hardening, that the Kubernetes manifests parse
// and agree with llmlb's configuration, and that every metric the Grafana
// dashboard and the Prometheus rules name is exported by llmlb's /metrics
// from start-up. `promtool check rules` runs in .ci/run.
package deploy_test

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/scrape"
	"github.com/llmlb/llmlb/internal/server"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// exported returns every series name on llmlb's /metrics right after
// start-up (two replicas with declared models, nothing scraped or served
// yet), histograms with their _bucket, _sum and _count names; and
// separately the flow-control series, which exist once a model's first
// request has passed flow control and, for the queue-wait histogram, once a
// held request was dispatched.
func exported(t *testing.T) (names map[string]bool, body string, flow map[string]bool) {
	t.Helper()
	cfg := config.Default()
	cfg.Replicas = []config.Replica{
		{Name: "gpu-a", URL: "http://127.0.0.1:1", Models: []string{"qwen"}},
		{Name: "gpu-b", URL: "http://127.0.0.1:2", Models: []string{"qwen"}},
	}
	srv, err := server.New(cfg, nil, server.WithFetcher(scrape.NewFake()))
	if err != nil {
		t.Fatal(err)
	}
	names, body = metricsPage(t, srv)

	// One request of the model (its replicas are unreachable: the answer
	// is an error) gives it a flow-control queue; a wait recorded as the
	// proxy records a held request's gives the queue-wait histogram a series.
	rec := httptest.NewRecorder()
	srv.ProxyHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions",
		strings.NewReader(`{"model":"qwen","messages":[{"role":"user","content":"hi"}]}`)))
	srv.Metrics().QueueWait(0, time.Second)
	flow, _ = metricsPage(t, srv)
	return names, body, flow
}

// metricsPage returns the series names on srv's /metrics and the page.
func metricsPage(t *testing.T, srv *server.Server) (map[string]bool, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	srv.AdminHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("/metrics: %d", rec.Code)
	}
	names := make(map[string]bool)
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		names[name] = true
	}
	return names, rec.Body.String()
}

var metricName = regexp.MustCompile(`\bllmlb_[a-zA-Z0-9_]+`)

// dashboardExprs returns every PromQL expression and template query of the dashboard.
func dashboardExprs(t *testing.T) []string {
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Query any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(read(t, "grafana/llmlb-dashboard.json"), &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("dashboard panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if q, ok := v.Query.(string); ok {
			out = append(out, q)
		}
	}
	return out
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func rules(t *testing.T) ruleFile {
	var rf ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(read(t, "prometheus/llmlb-rules.yaml")))
	dec.KnownFields(true)
	if err := dec.Decode(&rf); err != nil {
		t.Fatalf("rules: %v", err)
	}
	return rf
}

// TestEveryMetricInDashboardAndRulesIsExported: a dashboard panel or an
// alert naming a metric llmlb does not export (yet) would stay empty or
// never fire; every name must be on /metrics from start-up, except flow
// control's, which must be there once the model's first request passed.
func TestEveryMetricInDashboardAndRulesIsExported(t *testing.T) {
	names, body, flow := exported(t)
	exprs := dashboardExprs(t)
	for _, g := range rules(t).Groups {
		for _, r := range g.Rules {
			exprs = append(exprs, r.Expr)
		}
	}
	seen := 0
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			seen++
			switch {
			case strings.HasPrefix(m, "llmlb_flow_"):
				if !flow[m] {
					t.Errorf("%s (in %q) is not exported by /metrics once flow control saw a request", m, e)
				}
			case !names[m]:
				t.Errorf("%s (in %q) is not exported by /metrics at start-up", m, e)
			}
		}
	}
	if seen < 20 {
		t.Fatalf("only %d metric references found: is the dashboard or the rule file empty?", seen)
	}
	// The per-replica and per-model series exist for known replicas and
	// models before any event (an idle replica is a 0, not a gap).
	for _, want := range []string{
		`llmlb_requests_total{code="200",reason="load",replica="gpu-a"} 0`,
		`llmlb_scrapes_total{replica="gpu-b",result="ok"} 0`,
		`llmlb_replica_state{replica="gpu-a",state="EJECTED"} `, // 1 until its first good scrape
		`llmlb_time_to_first_token_seconds_count{model="qwen",route="affinity"} 0`,
		`llmlb_tokens_total{kind="cached",model="qwen"} 0`,
		`llmlb_max_cooldown_seconds 300`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics at start-up lacks %s", want)
		}
	}
}

// TestRuleFile: the four routing alerts (docs/ROUTING.md, "Alerts") and the SLO alerts are there, each
// with a severity and a runbook section in docs/OPERATIONS.md.
func TestRuleFile(t *testing.T) {
	ops := strings.ToLower(string(read(t, "../docs/OPERATIONS.md")))
	var alerts []string
	for _, g := range rules(t).Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for: %v", r.Alert, err)
				}
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("%s: severity %q", r.Alert, s)
			}
			rb := r.Annotations["runbook"]
			anchor, ok := strings.CutPrefix(rb, "docs/OPERATIONS.md#")
			if !ok || anchor != strings.ToLower(r.Alert) || !strings.Contains(ops, "### "+anchor) {
				t.Errorf("%s: runbook %q has no section \"### %s\" in docs/OPERATIONS.md", r.Alert, rb, r.Alert)
			}
		}
	}
	for _, want := range []string{"LLMLBImbalance", "LLMLBAllTrafficOnOneReplica", "LLMLBProbeBroken", "LLMLBReplicaFlapping",
		"LLMLBNoHealthyReplicas", "LLMLBErrorBudgetBurn", "LLMLBSlowTimeToFirstToken"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("rule file lacks alert %s", want)
		}
	}
}

// docs splits a multi-document YAML file.
func docs(t *testing.T, path string) []map[string]any {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(read(t, path)))
	var out []map[string]any
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if m != nil {
			out = append(out, m)
		}
	}
}

// get walks a parsed YAML document: get(m, "spec", "template", 0, ...).
func get(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

// TestKubernetesManifests: every manifest parses and has apiVersion, kind
// and name; the ConfigMap's llmlb.yaml is a valid llmlb configuration; the
// RBAC lets discovery list and watch what it reads; the Deployment runs as
// non-root with a read-only root, probes /healthz and /readyz, and leaves
// time for the drain.
func TestKubernetesManifests(t *testing.T) {
	t.Setenv("LLMLB_ADMIN_TOKEN", "test-token")
	byKind := manifestsByKind(t, "kubernetes", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service", "Kustomization")
	for _, r := range get(byKind["Kustomization"], "resources").([]any) {
		if _, err := os.Stat(filepath.Join("kubernetes", r.(string))); err != nil {
			t.Errorf("kustomization: %v", err)
		}
	}

	raw, _ := get(byKind["ConfigMap"], "data", "llmlb.yaml").(string)
	cfg, err := config.Parse([]byte(raw), "configmap llmlb.yaml")
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("the ConfigMap's llmlb.yaml: %v", err)
	}
	if cfg.Discovery.Type != "kubernetes" {
		t.Errorf("ConfigMap: discovery.type %q, want kubernetes", cfg.Discovery.Type)
	}

	granted := map[string][]any{}
	for _, r := range get(byKind["Role"], "rules").([]any) {
		for _, res := range get(r, "resources").([]any) {
			granted[res.(string)] = get(r, "verbs").([]any)
		}
	}
	for _, res := range []string{"endpointslices", "pods"} {
		for _, verb := range []string{"list", "watch"} {
			if !slices.Contains(granted[res], any(verb)) {
				t.Errorf("Role does not grant %s on %s", verb, res)
			}
		}
	}

	dep := byKind["Deployment"]
	pod := get(dep, "spec", "template", "spec")
	if get(pod, "serviceAccountName") != "llmlb" {
		t.Error("Deployment does not use the llmlb service account")
	}
	if get(pod, "securityContext", "runAsNonRoot") != true {
		t.Error("Deployment: runAsNonRoot is not true")
	}
	c := get(pod, "containers", 0)
	if get(c, "securityContext", "readOnlyRootFilesystem") != true || get(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Error("container: want readOnlyRootFilesystem true and allowPrivilegeEscalation false")
	}
	if get(c, "readinessProbe", "httpGet", "path") != "/readyz" || get(c, "livenessProbe", "httpGet", "path") != "/healthz" {
		t.Error("container: probes must use /readyz and /healthz")
	}
	grace, _ := get(pod, "terminationGracePeriodSeconds").(int)
	if time.Duration(grace)*time.Second <= cfg.Server.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %d does not exceed server.shutdown_timeout %s: streams would be cut", grace, cfg.Server.ShutdownTimeout)
	}
}

// TestDockerfile: a build stage that compiles a static binary, then a
// distroless (or scratch) stage running as a non-root user, with a config
// file that is valid.
func TestDockerfile(t *testing.T) {
	var stages [][]string // instructions per stage
	for _, line := range strings.Split(string(read(t, "Dockerfile")), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("instruction before FROM: %s", line)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], line)
	}
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, got %d stages", len(stages))
	}
	build := strings.Join(stages[0], "\n")
	if !strings.Contains(build, " AS build") || !strings.Contains(build, "CGO_ENABLED=0") || !strings.Contains(build, "./cmd/llmlb") {
		t.Errorf("build stage must be named build and compile ./cmd/llmlb with CGO_ENABLED=0:\n%s", build)
	}
	final := stages[len(stages)-1]
	from := final[0]
	if !strings.Contains(from, "distroless/static") && from != "FROM scratch" {
		t.Errorf("final stage %q is neither distroless/static nor scratch", from)
	}
	var user string
	for _, ins := range final {
		if u, ok := strings.CutPrefix(ins, "USER "); ok {
			user = u
		}
		if src, ok := strings.CutPrefix(ins, "COPY deploy/"); ok {
			f := strings.Fields(src)[0]
			cfg, err := config.Load(f)
			if err == nil {
				err = cfg.Validate()
			}
			if err != nil {
				t.Errorf("the image's configuration deploy/%s: %v", f, err)
			}
		}
	}
	if user == "" || user == "root" || strings.HasPrefix(user, "0") {
		t.Errorf("final stage runs as %q, want a non-root USER", user)
	}
}

// TestSystemdUnit: the unit is hardened and drains on stop.
func TestSystemdUnit(t *testing.T) {
	unit := string(read(t, "systemd/llmlb.service"))
	for _, want := range []string{
		"ExecStart=/usr/local/bin/llmlb serve --config /etc/llmlb/llmlb.yaml",
		"DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
		"PrivateTmp=yes", "PrivateDevices=yes", "CapabilityBoundingSet=\n", "RestrictAddressFamilies=",
		"SystemCallFilter=@system-service", "MemoryDenyWriteExecute=yes", "KillSignal=SIGTERM",
		"ExecReload=/bin/kill -HUP $MAINPID",
	} {
		if !strings.Contains(unit, want) {
			t.Errorf("systemd unit lacks %q", strings.TrimSpace(want))
		}
	}
}

// TestStaticBinary checks the binary .ci/run builds with the Dockerfile's
// flags (LLMLB_STATIC_BINARY names it): no dynamic loader, no shared
// libraries, so it runs in a distroless/static or scratch image.
func TestStaticBinary(t *testing.T) {
	path := os.Getenv("LLMLB_STATIC_BINARY")
	if path == "" {
		t.Skip("LLMLB_STATIC_BINARY not set (.ci/run sets it)")
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("%s is dynamically linked (program header %v)", path, p.Type)
		}
	}
}

// manifestsByKind parses every YAML document in deploy/dir, checks each has
// apiVersion, kind and (but a Kustomization) a name, that no kind appears
// twice and that every wanted kind is there, and returns them by kind.
func manifestsByKind(t *testing.T, dir string, want ...string) map[string]map[string]any {
	t.Helper()
	files, _ := filepath.Glob(dir + "/*.yaml")
	byKind := map[string]map[string]any{}
	for _, f := range files {
		for _, d := range docs(t, f) {
			kind, _ := d["kind"].(string)
			if d["apiVersion"] == nil || kind == "" {
				t.Errorf("%s: a document without apiVersion or kind", f)
				continue
			}
			if kind != "Kustomization" && get(d, "metadata", "name") == nil {
				t.Errorf("%s: %s without metadata.name", f, kind)
			}
			if byKind[kind] != nil {
				t.Errorf("%s: a second %s", f, kind)
			}
			byKind[kind] = d
		}
	}
	for _, k := range want {
		if byKind[k] == nil {
			t.Fatalf("no %s in deploy/%s", k, dir)
		}
	}
	return byKind
}
