package discovery

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1client "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// KubeClients are the typed clients the Kubernetes source uses. Only the
// two API groups it reads are linked in (not the whole clientset), which
// keeps the binary and its build small. Tests pass a fake clientset's.
type KubeClients struct {
	Slices discoveryv1client.EndpointSlicesGetter
	Pods   corev1client.PodsGetter
	// Clientset, when set, is asked whether it supports the watch-list
	// protocol (client-go's fake clientset does not).
	Clientset any
}

// Kubernetes discovers replicas with client-go informers: the ready
// endpoints of a Service's EndpointSlices, or the ready pods matching a
// label selector, at the port named (or numbered) in the config.
type Kubernetes struct {
	cfg       KubernetesConfig
	namespace string
	clients   KubeClients
	selector  labels.Selector
	log       *slog.Logger
}

// inClusterNamespace is where a pod finds its own namespace.
const inClusterNamespace = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// NewKubernetes connects with cfg.Kubeconfig, or in-cluster when it is
// empty. The namespace is cfg.Namespace, else the kubeconfig context's,
// else the pod's own.
func NewKubernetes(cfg KubernetesConfig, logger *slog.Logger) (*Kubernetes, error) {
	if logger != nil {
		// client-go reports watch failures and retries through klog: send
		// them to llmlb's structured log instead of bare lines on stderr.
		klog.SetSlogLogger(logger.With(slog.String("component", "client-go")))
	}
	var rc *rest.Config
	ns := cfg.Namespace
	if cfg.Kubeconfig != "" {
		loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: cfg.Kubeconfig}, &clientcmd.ConfigOverrides{})
		var err error
		if rc, err = loader.ClientConfig(); err != nil {
			return nil, fmt.Errorf("discovery: discovery.kubernetes.kubeconfig: %w", err)
		}
		if ns == "" {
			if ns, _, err = loader.Namespace(); err != nil {
				return nil, fmt.Errorf("discovery: discovery.kubernetes.kubeconfig: %w", err)
			}
		}
	} else {
		var err error
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("discovery: kubernetes: not in a cluster and discovery.kubernetes.kubeconfig is empty: %w", err)
		}
		if ns == "" {
			if b, err := os.ReadFile(inClusterNamespace); err == nil {
				ns = strings.TrimSpace(string(b))
			}
		}
	}
	if ns == "" {
		ns = "default"
	}
	rc.UserAgent = "llmlb"
	sc, err := discoveryv1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	pc, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("discovery: kubernetes: %w", err)
	}
	return NewKubernetesWith(cfg, ns, KubeClients{Slices: sc, Pods: pc}, logger), nil
}

// NewKubernetesWith builds the source on given clients (tests: a fake clientset).
func NewKubernetesWith(cfg KubernetesConfig, namespace string, clients KubeClients, logger *slog.Logger) *Kubernetes {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Scheme == "" {
		cfg.Scheme = "http"
	}
	sel, err := labels.Parse(cfg.LabelSelector)
	if err != nil {
		sel = labels.Nothing() // config.Validate reports it, naming the key
	}
	return &Kubernetes{cfg: cfg, namespace: namespace, clients: clients, selector: sel, log: logger}
}

// Run watches EndpointSlices (discovery.kubernetes.service) or pods
// (discovery.kubernetes.label_selector) and reports the set after the
// first full list and after every change.
func (k *Kubernetes) Run(ctx context.Context, update func([]Target)) error {
	var lw *cache.ListWatch
	var example runtime.Object
	var toTargets func([]any) []Target
	if k.cfg.Service != "" {
		sel := discoveryv1.LabelServiceName + "=" + k.cfg.Service
		c := k.clients.Slices.EndpointSlices(k.namespace)
		lw = &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = sel
				return c.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = sel
				return c.Watch(ctx, o)
			},
		}
		example, toTargets = &discoveryv1.EndpointSlice{}, k.fromSlices
	} else {
		c := k.clients.Pods.Pods(k.namespace)
		sel := k.cfg.LabelSelector
		lw = &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				o.LabelSelector = sel
				return c.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				o.LabelSelector = sel
				return c.Watch(ctx, o)
			},
		}
		example, toTargets = &corev1.Pod{}, k.fromPods
	}
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, k.clients.Clientset), example, 0, cache.Indexers{})
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, n any) { poke(n) },
		DeleteFunc: poke,
	}); err != nil {
		return fmt.Errorf("discovery: kubernetes: %w", err)
	}
	// client-go retries failed lists and watches with a backoff and reports
	// them only at debug: an unreachable API server or missing RBAC must
	// show at WARN (the last set is kept meanwhile).
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() == nil {
			k.log.Warn("discovery: kubernetes list/watch failed; keeping the last set and retrying",
				slog.String("namespace", k.namespace), slog.String("error", err.Error()))
		}
	}); err != nil {
		return fmt.Errorf("discovery: kubernetes: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.RunWithContext(ctx)
	}()
	// The informer stops with ctx, but only after a retry backoff in
	// progress (up to ~30 s with the API server down): wait briefly, not
	// for the whole backoff, so that shutdown is not held up.
	defer func() {
		select {
		case <-done:
		case <-time.After(time.Second):
		}
	}()
	if err := k.waitSynced(ctx, inf.HasSynced); err != nil {
		return err
	}
	k.log.Info("discovery: kubernetes watching", slog.String("namespace", k.namespace),
		slog.String("service", k.cfg.Service), slog.String("label_selector", k.cfg.LabelSelector))
	for {
		update(toTargets(inf.GetStore().List()))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// syncWarnEvery is how often a source that has not listed its objects yet
// says so at WARN.
const syncWarnEvery = 15 * time.Second

// waitSynced waits for the informer's first full list, warning every
// syncWarnEvery meanwhile (client-go logs its retries only at debug).
func (k *Kubernetes) waitSynced(ctx context.Context, synced func() bool) error {
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	warn := time.NewTicker(syncWarnEvery)
	defer warn.Stop()
	for !synced() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-warn.C:
			k.log.Warn("discovery: kubernetes has not listed the replicas yet: is the API server reachable, and does the service account have the Role of deploy/kubernetes/rbac.yaml?",
				slog.String("namespace", k.namespace), slog.String("service", k.cfg.Service), slog.String("label_selector", k.cfg.LabelSelector))
		case <-poll.C:
		}
	}
	return nil
}

// port resolves the configured port against a list of named ports.
func (k *Kubernetes) port(named func(name string) (int, bool)) (int, bool) {
	return resolvePort(k.cfg.Port, named)
}

// resolvePort resolves p, a port's number or name, against named ports.
func resolvePort(p string, named func(name string) (int, bool)) (int, bool) {
	if n, err := strconv.Atoi(p); err == nil {
		return n, true
	}
	return named(p)
}

// kvEvents sets t's KV event endpoints at host from the configured ports
// (none where a port is not configured or not found).
func (k *Kubernetes) kvEvents(t *Target, host string, named func(name string) (int, bool)) {
	if k.cfg.KVEventsPort == "" {
		return
	}
	pub, ok := resolvePort(k.cfg.KVEventsPort, named)
	if !ok {
		return
	}
	t.KVEvents = kvEndpoint(host, pub)
	if k.cfg.KVEventsReplayPort != "" {
		if rep, ok := resolvePort(k.cfg.KVEventsReplayPort, named); ok {
			t.KVEventsReplay = kvEndpoint(host, rep)
		}
	}
}

// fromSlices turns EndpointSlices into targets: ready endpoints only (a
// nil ready condition means ready), named after their pod. A pod in two
// slices (dual stack) is taken once, IPv4 first.
func (k *Kubernetes) fromSlices(objs []any) []Target {
	ss := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		// The label is checked again: a fake clientset's watch ignores selectors.
		if s, ok := o.(*discoveryv1.EndpointSlice); ok && s.Labels[discoveryv1.LabelServiceName] == k.cfg.Service {
			ss = append(ss, s)
		}
	}
	rank := map[discoveryv1.AddressType]int{discoveryv1.AddressTypeIPv4: 0, discoveryv1.AddressTypeIPv6: 1, discoveryv1.AddressTypeFQDN: 2}
	slices.SortFunc(ss, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(rank[a.AddressType], rank[b.AddressType]), strings.Compare(a.Name, b.Name))
	})
	var out []Target
	seen := make(map[string]bool)
	for _, s := range ss {
		named := func(name string) (int, bool) {
			for _, p := range s.Ports {
				if p.Name != nil && *p.Name == name && p.Port != nil {
					return int(*p.Port), true
				}
			}
			return 0, false
		}
		port, ok := k.port(named)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || (ep.Conditions.Ready != nil && !*ep.Conditions.Ready) {
				continue
			}
			host := ep.Addresses[0]
			pod := ""
			if ep.TargetRef != nil && ep.TargetRef.Kind == "Pod" {
				pod = ep.TargetRef.Name
			}
			t := Target{Name: targetName(pod, host, port), URL: targetURL(k.cfg.Scheme, host, port), Models: k.cfg.Models}
			k.kvEvents(&t, host, named)
			if !seen[t.Name] {
				seen[t.Name] = true
				out = append(out, t)
			}
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// fromPods turns pods into targets: running, Ready, not being deleted,
// with an IP and the configured port.
func (k *Kubernetes) fromPods(objs []any) []Target {
	var out []Target
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || !k.selector.Matches(labels.Set(p.Labels)) || p.Status.PodIP == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || !podReady(p) {
			continue
		}
		named := func(name string) (int, bool) {
			for _, c := range p.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == name {
						return int(cp.ContainerPort), true
					}
				}
			}
			return 0, false
		}
		port, ok := k.port(named)
		if !ok {
			continue
		}
		t := Target{Name: targetName(p.Name, p.Status.PodIP, port), URL: targetURL(k.cfg.Scheme, p.Status.PodIP, port), Models: k.cfg.Models}
		k.kvEvents(&t, p.Status.PodIP, named)
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
