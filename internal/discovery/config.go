package discovery

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/llmlb/llmlb/internal/keyname"
	"github.com/llmlb/llmlb/internal/replicaurl"
)

// Config selects where the replica set comes from besides the static
// list (discovery: in YAML). Static replicas, replicas added through the
// admin API and discovered ones live side by side; discovery only adds and
// removes the replicas it found itself, through the admin API's path (a
// replica that disappears drains: no new traffic, in-flight responses
// finish, then it is removed).
type Config struct {
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

	Kubernetes KubernetesConfig // discovery.kubernetes
	DNS        DNSConfig        // discovery.dns
	Gpustack   GPUStackConfig   // discovery.gpustack
}

// KubernetesConfig discovers replicas from the EndpointSlices of a Service
// or from pods matching a label selector (exactly one of the two).
type KubernetesConfig struct {
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
	// KVEventsPort is the port, name or number, where each replica
	// publishes its KV cache events (discovery.kubernetes.kv_events_port;
	// "" none): llmlb subscribes to tcp://pod-ip:port. A replica without
	// that port is added without events.
	KVEventsPort string
	// KVEventsReplayPort is the port, name or number, of each replica's
	// replay socket (discovery.kubernetes.kv_events_replay_port; "" none).
	KVEventsReplayPort string
}

// DNSConfig discovers replicas from the A/AAAA or SRV records of a name (a
// headless Service), resolved again every Interval.
type DNSConfig struct {
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

// GPUStackConfig discovers replicas from a GPUStack server's model
// instances (API v2, falling back to v1), polled every Interval.
type GPUStackConfig struct {
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

// Types are the accepted values of discovery.type.
var Types = []string{"static", "kubernetes", "dns", "gpustack"}

// DefaultConfig returns discovery's defaults: static, nothing discovered.
func DefaultConfig() Config {
	return Config{
		Type:         "static",
		DrainTimeout: 10 * time.Minute,
		Kubernetes:   KubernetesConfig{Port: "http", Scheme: "http", Models: []string{}},
		DNS:          DNSConfig{Record: "a", Port: 8000, Interval: 30 * time.Second, Scheme: "http", Models: []string{}},
		Gpustack:     GPUStackConfig{Interval: 15 * time.Second, Scheme: "http", Timeout: 10 * time.Second, Models: []string{}},
	}
}

// Enabled reports whether a discovery source other than static is configured.
func (d Config) Enabled() bool { return d.Type != "" && d.Type != "static" }

// redacted replaces a secret in printed configurations (as package config
// does for its own).
const redacted = "<redacted>"

// Redacted returns a copy with its secrets replaced by "<redacted>".
func (d Config) Redacted() Config {
	if d.APIKey != "" {
		d.APIKey = redacted
	}
	if d.Gpustack.APIKey != "" {
		d.Gpustack.APIKey = redacted
	}
	return d
}

// Validate reports every problem of the discovery section at once
// (errors.Join), each a *keyname.Error naming its key
// (discovery.kubernetes.service); only the chosen source's keys must be
// complete.
func (d Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, keyname.Errorf(key, format, args...))
	}
	oneOf := func(key, val string, allowed ...string) {
		for _, a := range allowed {
			if val == a {
				return
			}
		}
		hint := ""
		if s := keyname.Suggest(val, allowed); s != "" {
			hint = fmt.Sprintf(" (did you mean %q?)", s)
		}
		bad(key, "%q is not one of %s%s", val, strings.Join(allowed, ", "), hint)
	}
	positive := func(key string, v time.Duration) {
		if v <= 0 {
			bad(key, "must be > 0, got %s", v)
		}
	}
	// A token must fit in an Authorization header; the message never
	// quotes the secret.
	secret := func(key, s string) {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x21 || c > 0x7e {
				bad(key, "contains a space, control or non-ASCII character at byte %d (a stray newline from the environment?)", i)
				return
			}
		}
	}
	scheme := func(key, s string) {
		if s != "http" && s != "https" {
			bad(key, "%q is not http or https", s)
		}
	}
	// Model names are non-empty and not repeated.
	models := func(key string, ms []string) {
		seen := make(map[string]bool, len(ms))
		for i, m := range ms {
			switch {
			case m == "":
				bad(fmt.Sprintf("%s[%d]", key, i), "empty model name")
			case seen[m]:
				bad(fmt.Sprintf("%s[%d]", key, i), "%q is listed twice", m)
			}
			seen[m] = true
		}
	}

	oneOf("discovery.type", d.Type, Types...)
	secret("discovery.api_key", d.APIKey)
	if d.DrainTimeout < 0 {
		bad("discovery.drain_timeout", "must be >= 0, got %s", d.DrainTimeout)
	}
	switch d.Type {
	case "kubernetes":
		k := d.Kubernetes
		switch {
		case k.Service == "" && k.LabelSelector == "":
			bad("discovery.kubernetes.service", "set service (its EndpointSlices) or label_selector (pods) for discovery.type kubernetes")
		case k.Service != "" && k.LabelSelector != "":
			bad("discovery.kubernetes.label_selector", "set service or label_selector, not both")
		}
		if k.LabelSelector != "" {
			if _, err := labels.Parse(k.LabelSelector); err != nil {
				bad("discovery.kubernetes.label_selector", "%q: %v", k.LabelSelector, err)
			}
		}
		if k.Port == "" {
			bad("discovery.kubernetes.port", "empty: name the replicas' port (e.g. http) or give its number")
		} else if n, err := strconv.Atoi(k.Port); err == nil && (n < 1 || n > 65535) {
			bad("discovery.kubernetes.port", "%d is not a port number in 1..65535", n)
		}
		scheme("discovery.kubernetes.scheme", k.Scheme)
		models("discovery.kubernetes.models", k.Models)
		for _, p := range [][2]string{{"discovery.kubernetes.kv_events_port", k.KVEventsPort}, {"discovery.kubernetes.kv_events_replay_port", k.KVEventsReplayPort}} {
			if n, err := strconv.Atoi(p[1]); err == nil && (n < 1 || n > 65535) {
				bad(p[0], "%d is not a port number in 1..65535", n)
			}
		}
		if k.KVEventsReplayPort != "" && k.KVEventsPort == "" {
			bad("discovery.kubernetes.kv_events_replay_port", "needs kv_events_port")
		}
	case "dns":
		n := d.DNS
		if n.Name == "" {
			bad("discovery.dns.name", "empty: the name to resolve (e.g. vllm.inference.svc.cluster.local) is required for discovery.type dns")
		}
		oneOf("discovery.dns.record", n.Record, "a", "srv")
		if n.Record == "a" && (n.Port < 1 || n.Port > 65535) {
			bad("discovery.dns.port", "%d is not a port number in 1..65535", n.Port)
		}
		positive("discovery.dns.interval", n.Interval)
		scheme("discovery.dns.scheme", n.Scheme)
		models("discovery.dns.models", n.Models)
	case "gpustack":
		g := d.Gpustack
		if g.URL == "" {
			bad("discovery.gpustack.url", "empty: the GPUStack server's URL is required for discovery.type gpustack")
		} else if u, err := url.Parse(g.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("discovery.gpustack.url", "%q is not an absolute http(s) URL", replicaurl.Redact(g.URL))
		}
		secret("discovery.gpustack.api_key", g.APIKey)
		positive("discovery.gpustack.interval", g.Interval)
		positive("discovery.gpustack.timeout", g.Timeout)
		scheme("discovery.gpustack.scheme", g.Scheme)
		models("discovery.gpustack.models", g.Models)
	}
	return errors.Join(errs...)
}
