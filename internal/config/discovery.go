package config

import (
	"fmt"
	"net/url"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

// Discovery selects where the replica set comes from besides the static
// list (discovery: in YAML). Static replicas, replicas added through the
// admin API and discovered ones live side by side; discovery only adds and
// removes the replicas it found itself, through the admin API's path (a
// replica that disappears drains: no new traffic, in-flight responses
// finish, then it is removed).
type Discovery struct {
	// Type is static (the default: only replicas: and the admin API),
	// kubernetes, dns or gpustack (discovery.type).
	Type string
	// DrainTimeout bounds how long a vanished replica keeps its in-flight
	// responses before it is removed anyway (discovery.drain_timeout, 10m).
	DrainTimeout time.Duration
	// APIKey is sent to every discovered replica as a bearer token
	// (discovery.api_key or discovery.api_key_env; none: the client's
	// Authorization passes as configured).
	APIKey string

	Kubernetes Kubernetes // discovery.kubernetes
	DNS        DNS        // discovery.dns
	Gpustack   Gpustack   // discovery.gpustack
}

// Kubernetes discovers replicas from the EndpointSlices of a Service or
// from pods matching a label selector (exactly one of the two).
type Kubernetes struct {
	// Kubeconfig is the path of a kubeconfig file; empty: the in-cluster
	// service account (discovery.kubernetes.kubeconfig).
	Kubeconfig string
	// Namespace to watch; empty: the pod's own namespace in-cluster, else
	// the kubeconfig's (discovery.kubernetes.namespace).
	Namespace string
	// Service whose EndpointSlices list the replicas (discovery.kubernetes.service).
	Service string
	// LabelSelector picks replica pods instead, e.g. "app=vllm"
	// (discovery.kubernetes.label_selector).
	LabelSelector string
	// Port is the replica port's name ("http") or number
	// (discovery.kubernetes.port, "http").
	Port string
	// Scheme of the replicas' URLs (discovery.kubernetes.scheme, "http").
	Scheme string
	// Models the replicas serve; empty: learned from /v1/models.
	Models []string
}

// DNS discovers replicas from the A/AAAA or SRV records of a name (a
// headless Service), resolved again every Interval.
type DNS struct {
	// Name to resolve, e.g. vllm.inference.svc.cluster.local; for SRV the
	// full record name, e.g. _http._tcp.vllm.inference.svc.cluster.local
	// (discovery.dns.name).
	Name string
	// Record is a (A and AAAA) or srv (discovery.dns.record, "a").
	Record string
	// Port of the replicas for A/AAAA records (discovery.dns.port, 8000);
	// SRV records carry their own.
	Port int
	// Interval between two resolutions (discovery.dns.interval, 30s).
	Interval time.Duration
	// Scheme of the replicas' URLs (discovery.dns.scheme, "http").
	Scheme string
	// Models the replicas serve; empty: learned from /v1/models.
	Models []string
}

// Gpustack discovers replicas from a GPUStack server's model instances
// (API v2, falling back to v1), polled every Interval.
type Gpustack struct {
	// URL of the GPUStack server, e.g. http://gpustack.internal
	// (discovery.gpustack.url).
	URL string
	// APIKey for the GPUStack API (discovery.gpustack.api_key or
	// api_key_env). It is never sent to the instances (see discovery.api_key).
	APIKey string
	// Interval between two polls (discovery.gpustack.interval, 15s).
	Interval time.Duration
	// Models keeps only instances of these models; empty: every model.
	Models []string
	// Scheme of the instances' URLs (discovery.gpustack.scheme, "http").
	Scheme string
	// Timeout of one poll (discovery.gpustack.timeout, 10s).
	Timeout time.Duration
}

// DiscoveryTypes are the accepted values of discovery.type.
var DiscoveryTypes = []string{"static", "kubernetes", "dns", "gpustack"}

// DefaultDiscovery returns discovery's defaults: static, nothing discovered.
func DefaultDiscovery() Discovery {
	return Discovery{
		Type:         "static",
		DrainTimeout: 10 * time.Minute,
		Kubernetes:   Kubernetes{Port: "http", Scheme: "http", Models: []string{}},
		DNS:          DNS{Record: "a", Port: 8000, Interval: 30 * time.Second, Scheme: "http", Models: []string{}},
		Gpustack:     Gpustack{Interval: 15 * time.Second, Scheme: "http", Timeout: 10 * time.Second, Models: []string{}},
	}
}

// Enabled reports whether a discovery source other than static is configured.
func (d Discovery) Enabled() bool { return d.Type != "" && d.Type != "static" }

// Redacted returns a copy with its secrets replaced by "<redacted>".
func (d Discovery) Redacted() Discovery {
	if d.APIKey != "" {
		d.APIKey = redacted
	}
	if d.Gpustack.APIKey != "" {
		d.Gpustack.APIKey = redacted
	}
	return d
}

// discovery checks the discovery section; only the chosen source's keys
// must be complete.
func (v *validator) discovery(d Discovery) {
	v.oneOf("discovery.type", d.Type, DiscoveryTypes...)
	v.secret("discovery.api_key", d.APIKey)
	if d.DrainTimeout < 0 {
		v.add("discovery.drain_timeout", "must be >= 0, got %s", d.DrainTimeout)
	}
	scheme := func(key, s string) {
		if s != "http" && s != "https" {
			v.add(key, "%q is not http or https", s)
		}
	}
	switch d.Type {
	case "kubernetes":
		k := d.Kubernetes
		switch {
		case k.Service == "" && k.LabelSelector == "":
			v.add("discovery.kubernetes.service", "set service (its EndpointSlices) or label_selector (pods) for discovery.type kubernetes")
		case k.Service != "" && k.LabelSelector != "":
			v.add("discovery.kubernetes.label_selector", "set service or label_selector, not both")
		}
		if k.LabelSelector != "" {
			if _, err := labels.Parse(k.LabelSelector); err != nil {
				v.add("discovery.kubernetes.label_selector", "%q: %v", k.LabelSelector, err)
			}
		}
		if k.Port == "" {
			v.add("discovery.kubernetes.port", "empty: name the replicas' port (e.g. http) or give its number")
		} else if n, err := strconv.Atoi(k.Port); err == nil && (n < 1 || n > 65535) {
			v.add("discovery.kubernetes.port", "%d is not a port number in 1..65535", n)
		}
		scheme("discovery.kubernetes.scheme", k.Scheme)
		v.models("discovery.kubernetes.models", k.Models)
	case "dns":
		n := d.DNS
		if n.Name == "" {
			v.add("discovery.dns.name", "empty: the name to resolve (e.g. vllm.inference.svc.cluster.local) is required for discovery.type dns")
		}
		v.oneOf("discovery.dns.record", n.Record, "a", "srv")
		if n.Record == "a" && (n.Port < 1 || n.Port > 65535) {
			v.add("discovery.dns.port", "%d is not a port number in 1..65535", n.Port)
		}
		v.positive("discovery.dns.interval", n.Interval)
		scheme("discovery.dns.scheme", n.Scheme)
		v.models("discovery.dns.models", n.Models)
	case "gpustack":
		g := d.Gpustack
		if g.URL == "" {
			v.add("discovery.gpustack.url", "empty: the GPUStack server's URL is required for discovery.type gpustack")
		} else if u, err := url.Parse(g.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			v.add("discovery.gpustack.url", "%q is not an absolute http(s) URL", redactURL(g.URL))
		}
		v.secret("discovery.gpustack.api_key", g.APIKey)
		v.positive("discovery.gpustack.interval", g.Interval)
		v.positive("discovery.gpustack.timeout", g.Timeout)
		scheme("discovery.gpustack.scheme", g.Scheme)
		v.models("discovery.gpustack.models", g.Models)
	}
}

// models checks a model list: names non-empty and not repeated.
func (v *validator) models(key string, ms []string) {
	seen := make(map[string]bool, len(ms))
	for i, m := range ms {
		switch {
		case m == "":
			v.add(fmt.Sprintf("%s[%d]", key, i), "empty model name")
		case seen[m]:
			v.add(fmt.Sprintf("%s[%d]", key, i), "%q is listed twice", m)
		}
		seen[m] = true
	}
}
