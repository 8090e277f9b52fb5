package deploy_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/llmlb/llmlb/internal/config"
)

// TestEPPManifests: deploy/epp (llmlb as an InferencePool's endpoint
// picker) parses, and its pieces agree with each other and with llmlb: the
// ConfigMap is a valid configuration whose discovery selects the
// InferencePool's pods at its target port; the InferencePool's picker is
// the Service, whose gRPC port is the one `llmlb epp` listens on; the
// HTTPRoute sends the Gateway's traffic to the pool; the RBAC lets
// discovery read pods and EndpointSlices (and InferencePools); the
// Deployment is hardened like serve's. There is no cluster here: this is
// the whole of their validation (docs/EPP.md).
func TestEPPManifests(t *testing.T) {
	t.Setenv("LLMLB_ADMIN_TOKEN", "test-token")
	byKind := manifestsByKind(t, "epp", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service",
		"InferencePool", "Gateway", "HTTPRoute", "Kustomization", "NetworkPolicy")

	// The NetworkPolicy covers the picker's pods and admits its gRPC port
	// only from selected (gateway) pods.
	np := byKind["NetworkPolicy"]
	if !labels.SelectorFromSet(labelSet(get(np, "spec", "podSelector", "matchLabels"))).Matches(labels.Set(labelSet(get(byKind["Deployment"], "spec", "template", "metadata", "labels")))) {
		t.Error("the NetworkPolicy does not select the Deployment's pods")
	}
	for _, rule := range get(np, "spec", "ingress").([]any) {
		for _, p := range get(rule, "ports").([]any) {
			if get(p, "port") == 9002 && (get(rule, "from") == nil || get(rule, "from", 0, "podSelector") == nil) {
				t.Error("the NetworkPolicy admits port 9002 from anyone; want only the gateway's pods")
			}
		}
	}
	var listed []string
	for _, r := range get(byKind["Kustomization"], "resources").([]any) {
		listed = append(listed, r.(string))
		if _, err := os.Stat(filepath.Join("epp", r.(string))); err != nil {
			t.Errorf("kustomization: %v", err)
		}
	}
	files, _ := filepath.Glob("epp/*.yaml")
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !slices.Contains(listed, b) {
			t.Errorf("kustomization does not list %s", b)
		}
	}

	// The pool: v1 API, its picker is our Service at the gRPC port.
	pool := byKind["InferencePool"]
	if pool["apiVersion"] != "inference.networking.k8s.io/v1" {
		t.Errorf("InferencePool apiVersion %v, want inference.networking.k8s.io/v1", pool["apiVersion"])
	}
	svc, dep := byKind["Service"], byKind["Deployment"]
	if get(pool, "spec", "endpointPickerRef", "name") != get(svc, "metadata", "name") {
		t.Errorf("endpointPickerRef.name %v is not the Service %v", get(pool, "spec", "endpointPickerRef", "name"), get(svc, "metadata", "name"))
	}
	pickerPort, _ := get(pool, "spec", "endpointPickerRef", "port", "number").(int)
	if pickerPort != 9002 {
		t.Errorf("endpointPickerRef port %d, want 9002 (llmlb epp's default)", pickerPort)
	}
	var grpcSvc map[string]any
	for _, p := range get(svc, "spec", "ports").([]any) {
		if get(p, "port") == pickerPort {
			grpcSvc = p.(map[string]any)
		}
	}
	if grpcSvc == nil || grpcSvc["appProtocol"] != "http2" {
		t.Fatalf("Service: no port %d with appProtocol http2 (gRPC): %v", pickerPort, get(svc, "spec", "ports"))
	}
	if !labels.SelectorFromSet(labelSet(get(svc, "spec", "selector"))).Matches(labels.Set(labelSet(get(dep, "spec", "template", "metadata", "labels")))) {
		t.Error("the Service does not select the Deployment's pods")
	}

	// The Deployment runs `llmlb epp` listening where the Service sends.
	pod := get(dep, "spec", "template", "spec")
	c := get(pod, "containers", 0)
	var args []string
	for _, a := range get(c, "args").([]any) {
		args = append(args, a.(string))
	}
	if len(args) == 0 || args[0] != "epp" {
		t.Fatalf("container args %q: want the epp command", args)
	}
	listen := ":9002"
	if i := slices.Index(args, "--grpc-listen"); i >= 0 && i+1 < len(args) {
		listen = args[i+1]
	}
	named := map[string]int{}
	for _, p := range get(c, "ports").([]any) {
		named[get(p, "name").(string)] = get(p, "containerPort").(int)
	}
	if !strings.HasSuffix(listen, ":"+strconv.Itoa(named["grpc"])) {
		t.Errorf("--grpc-listen %s is not the container's grpc port %d", listen, named["grpc"])
	}
	if tp := grpcSvc["targetPort"]; tp != "grpc" && tp != named["grpc"] {
		t.Errorf("Service targetPort %v is not the container's grpc port", tp)
	}
	if get(pod, "serviceAccountName") != get(byKind["ServiceAccount"], "metadata", "name") {
		t.Error("Deployment does not use the ServiceAccount")
	}
	if get(pod, "securityContext", "runAsNonRoot") != true {
		t.Error("Deployment: runAsNonRoot is not true")
	}
	if get(c, "securityContext", "readOnlyRootFilesystem") != true || get(c, "securityContext", "allowPrivilegeEscalation") != false {
		t.Error("container: want readOnlyRootFilesystem true and allowPrivilegeEscalation false")
	}
	if get(c, "readinessProbe", "httpGet", "path") != "/readyz" || get(c, "livenessProbe", "grpc", "service") != "liveness" ||
		get(c, "livenessProbe", "grpc", "port") != named["grpc"] {
		t.Error("container: want readiness on /readyz and liveness on the gRPC health service \"liveness\"")
	}

	// The configuration selects the pool's pods at its port.
	cm := byKind["ConfigMap"]
	if vols := get(pod, "volumes", 0, "configMap", "name"); vols != get(cm, "metadata", "name") {
		t.Errorf("Deployment mounts ConfigMap %v, not %v", vols, get(cm, "metadata", "name"))
	}
	raw, _ := get(cm, "data", "llmlb.yaml").(string)
	cfg, err := config.Parse([]byte(raw), "configmap llmlb.yaml")
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("the ConfigMap's llmlb.yaml: %v", err)
	}
	k := cfg.Discovery.Kubernetes
	if cfg.Discovery.Type != "kubernetes" || k.LabelSelector == "" {
		t.Fatalf("ConfigMap: want discovery.type kubernetes with the pool's label_selector, got %q %q", cfg.Discovery.Type, k.LabelSelector)
	}
	sel, err := labels.Parse(k.LabelSelector)
	if err != nil {
		t.Fatal(err)
	}
	want := labels.SelectorFromSet(labelSet(get(pool, "spec", "selector", "matchLabels")))
	if sel.String() != want.String() {
		t.Errorf("discovery label_selector %q is not the InferencePool's selector %q", sel, want)
	}
	if tp := get(pool, "spec", "targetPorts", 0, "number"); strconv.Itoa(tp.(int)) != k.Port {
		t.Errorf("discovery port %q is not the InferencePool's target port %v", k.Port, tp)
	}
	grace, _ := get(pod, "terminationGracePeriodSeconds").(int)
	if time.Duration(grace)*time.Second <= cfg.Server.ShutdownTimeout {
		t.Errorf("terminationGracePeriodSeconds %d does not exceed server.shutdown_timeout %s", grace, cfg.Server.ShutdownTimeout)
	}

	// The route: the Gateway's traffic to the pool.
	route := byKind["HTTPRoute"]
	if get(route, "spec", "parentRefs", 0, "name") != get(byKind["Gateway"], "metadata", "name") {
		t.Error("HTTPRoute's parent is not the Gateway")
	}
	be := get(route, "spec", "rules", 0, "backendRefs", 0)
	if get(be, "group") != "inference.networking.k8s.io" || get(be, "kind") != "InferencePool" || get(be, "name") != get(pool, "metadata", "name") {
		t.Errorf("HTTPRoute backendRef %v is not the InferencePool", be)
	}

	// RBAC: read-only, what discovery needs.
	granted := map[string][]any{}
	for _, r := range get(byKind["Role"], "rules").([]any) {
		for _, res := range get(r, "resources").([]any) {
			granted[res.(string)] = get(r, "verbs").([]any)
		}
	}
	for _, res := range []string{"pods", "endpointslices", "inferencepools"} {
		for _, verb := range []string{"list", "watch"} {
			if !slices.Contains(granted[res], any(verb)) {
				t.Errorf("Role does not grant %s on %s", verb, res)
			}
		}
		for _, verb := range granted[res] {
			if v := verb.(string); v != "get" && v != "list" && v != "watch" {
				t.Errorf("Role grants %s on %s: read-only is enough", v, res)
			}
		}
	}
	rb := byKind["RoleBinding"]
	if get(rb, "roleRef", "name") != get(byKind["Role"], "metadata", "name") ||
		get(rb, "subjects", 0, "name") != get(byKind["ServiceAccount"], "metadata", "name") {
		t.Error("RoleBinding does not bind the Role to the ServiceAccount")
	}
}

func labelSet(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, x := range m {
		out[k], _ = x.(string)
	}
	return out
}
