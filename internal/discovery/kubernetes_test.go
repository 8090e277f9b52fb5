package discovery

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func ptr[T any](v T) *T { return &v }

type ep struct {
	pod   string
	ip    string
	ready *bool
}

func slice(name, svc string, port string, portNum int32, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr("metrics"), Port: ptr(int32(9100))}, {Name: ptr(port), Port: ptr(portNum)}},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{e.ip},
			Conditions: discoveryv1.EndpointConditions{Ready: e.ready},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Name: e.pod},
		})
	}
	return s
}

// watchSets runs src and returns a function that waits for the next set.
func watchSets(t *testing.T, src Source) func() []string {
	t.Helper()
	sets := make(chan []Target)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- src.Run(ctx, func(ts []Target) {
			select {
			case sets <- ts:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return func() []string {
		var out []string
		for _, t := range <-sets {
			out = append(out, t.Name+"="+t.URL)
		}
		return out
	}
}

// next waits for the set to become want (informers may report
// intermediate sets, e.g. one per event).
func next(t *testing.T, get func() []string, want ...string) {
	t.Helper()
	for {
		got := get()
		if cmp.Equal(got, want) || (len(got) == 0 && len(want) == 0) {
			return
		}
		t.Logf("intermediate set %v (waiting for %v)", got, want)
	}
}

// TestKubernetesEndpointSlices: ready endpoints of the Service's slices at
// the named port, followed as slices are created, changed and deleted;
// other services' slices are ignored.
func TestKubernetesEndpointSlices(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(
		slice("vllm-abc", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", nil}, ep{"vllm-1", "10.1.0.11", ptr(true)}, ep{"vllm-2", "10.1.0.12", ptr(false)}),
		slice("other-xyz", "other", "http", 8000, ep{"other-0", "10.1.0.99", nil}),
	)
	src := NewKubernetesWith(KubernetesConfig{Service: "vllm", Port: "http"}, "inference",
		KubeClients{Slices: cs.DiscoveryV1(), Pods: cs.CoreV1(), Clientset: cs}, nil)
	get := watchSets(t, src)
	next(t, get, "vllm-0=http://10.1.0.10:8000", "vllm-1=http://10.1.0.11:8000")

	// vllm-2 becomes ready, vllm-0 leaves.
	s := slice("vllm-abc", "vllm", "http", 8000, ep{"vllm-1", "10.1.0.11", ptr(true)}, ep{"vllm-2", "10.1.0.12", ptr(true)})
	if _, err := cs.DiscoveryV1().EndpointSlices("inference").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next(t, get, "vllm-1=http://10.1.0.11:8000", "vllm-2=http://10.1.0.12:8000")

	// A second slice of the same service adds its endpoints.
	s2 := slice("vllm-def", "vllm", "http", 8000, ep{"vllm-3", "10.1.0.13", nil})
	if _, err := cs.DiscoveryV1().EndpointSlices("inference").Create(ctx, s2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	next(t, get, "vllm-1=http://10.1.0.11:8000", "vllm-2=http://10.1.0.12:8000", "vllm-3=http://10.1.0.13:8000")

	if err := cs.DiscoveryV1().EndpointSlices("inference").Delete(ctx, "vllm-abc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next(t, get, "vllm-3=http://10.1.0.13:8000")
}

func pod(name, ip string, ready bool, lbl string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "inference", Labels: map[string]string{"app": lbl}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

// TestKubernetesPods: running, Ready pods matching the selector, at the
// container port named in the config.
func TestKubernetesPods(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(pod("vllm-0", "10.2.0.10", true, "vllm"), pod("vllm-1", "10.2.0.11", false, "vllm"), pod("web-0", "10.2.0.50", true, "web"))
	src := NewKubernetesWith(KubernetesConfig{LabelSelector: "app=vllm", Port: "http", Scheme: "http", Models: []string{"m"}}, "inference",
		KubeClients{Slices: cs.DiscoveryV1(), Pods: cs.CoreV1(), Clientset: cs}, nil)
	get := watchSets(t, src)
	next(t, get, "vllm-0=http://10.2.0.10:8000")

	if _, err := cs.CoreV1().Pods("inference").UpdateStatus(ctx, pod("vllm-1", "10.2.0.11", true, "vllm"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next(t, get, "vllm-0=http://10.2.0.10:8000", "vllm-1=http://10.2.0.11:8000")
	// A pod relabelled out of the selector leaves (the fake's watch does
	// not filter by label: the source checks again).
	if _, err := cs.CoreV1().Pods("inference").Update(ctx, pod("vllm-0", "10.2.0.10", true, "old"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	next(t, get, "vllm-1=http://10.2.0.11:8000")
}

// TestNewKubernetesFromKubeconfig: a kubeconfig file gives the clients and,
// when discovery.kubernetes.namespace is empty, the context's namespace; a
// missing file is an error naming the key.
func TestNewKubernetesFromKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "http://127.0.0.1:1"}
users:
- name: u
  user: {token: t}
contexts:
- name: ctx
  context: {cluster: c, user: u, namespace: inference}
current-context: ctx
`
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := NewKubernetes(KubernetesConfig{Kubeconfig: path, Service: "vllm", Port: "http"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if k.namespace != "inference" {
		t.Errorf("namespace %q, want the context's", k.namespace)
	}
	k, err = NewKubernetes(KubernetesConfig{Kubeconfig: path, Namespace: "other", Service: "vllm", Port: "http"}, nil)
	if err != nil || k.namespace != "other" {
		t.Errorf("explicit namespace: %v, %v", k, err)
	}
	_, err = NewKubernetes(KubernetesConfig{Kubeconfig: filepath.Join(t.TempDir(), "missing"), Service: "vllm"}, nil)
	if err == nil || !strings.Contains(err.Error(), "discovery.kubernetes.kubeconfig") {
		t.Errorf("missing kubeconfig: %v", err)
	}
}

// TestKubernetesKVEventsPorts: with kv_events_port (and
// kv_events_replay_port) each target gets tcp://address:port from the
// slice's or the pod's ports, by name or number; a replica without the
// named port is still a target, without events.
func TestKubernetesKVEventsPorts(t *testing.T) {
	withKV := func(s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
		s.Ports = append(s.Ports, discoveryv1.EndpointPort{Name: ptr("kv-events"), Port: ptr(int32(5557))})
		return s
	}
	kvPod := func(name, ip string) *corev1.Pod {
		p := pod(name, ip, true, "vllm")
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "kv-events", ContainerPort: 5557})
		return p
	}
	cases := []struct {
		name   string
		cfg    KubernetesConfig
		slices []any
		pods   []any
		want   []string // name kv_events kv_events_replay
	}{
		{name: "slice, named port", cfg: KubernetesConfig{Service: "vllm", Port: "http", Scheme: "http", KVEventsPort: "kv-events"},
			slices: []any{withKV(slice("a", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", nil}))},
			want:   []string{"vllm-0 tcp://10.1.0.10:5557 "}},
		{name: "slice, numbered ports", cfg: KubernetesConfig{Service: "vllm", Port: "http", Scheme: "http", KVEventsPort: "5557", KVEventsReplayPort: "5558"},
			slices: []any{slice("a", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", nil})},
			want:   []string{"vllm-0 tcp://10.1.0.10:5557 tcp://10.1.0.10:5558"}},
		{name: "slice without the named port", cfg: KubernetesConfig{Service: "vllm", Port: "http", Scheme: "http", KVEventsPort: "kv-events"},
			slices: []any{slice("a", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", nil})},
			want:   []string{"vllm-0  "}},
		{name: "no kv_events_port", cfg: KubernetesConfig{Service: "vllm", Port: "http", Scheme: "http"},
			slices: []any{withKV(slice("a", "vllm", "http", 8000, ep{"vllm-0", "10.1.0.10", nil}))},
			want:   []string{"vllm-0  "}},
		{name: "pods, named port", cfg: KubernetesConfig{LabelSelector: "app=vllm", Port: "http", Scheme: "http", KVEventsPort: "kv-events"},
			pods: []any{kvPod("vllm-0", "10.2.0.10"), pod("vllm-1", "10.2.0.11", true, "vllm")},
			want: []string{"vllm-0 tcp://10.2.0.10:5557 ", "vllm-1  "}},
	}
	for _, c := range cases {
		cs := fake.NewClientset()
		k := NewKubernetesWith(c.cfg, "inference", KubeClients{Slices: cs.DiscoveryV1(), Pods: cs.CoreV1(), Clientset: cs}, nil)
		var ts []Target
		if c.slices != nil {
			ts = k.fromSlices(c.slices)
		} else {
			ts = k.fromPods(c.pods)
		}
		var got []string
		for _, tg := range ts {
			got = append(got, tg.Name+" "+tg.KVEvents+" "+tg.KVEventsReplay)
		}
		if !cmp.Equal(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
