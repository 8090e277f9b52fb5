package admin

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmlb/llmlb/internal/balancer"
)

// maxCachedChildren bounds each cache of children; a cache that would
// grow past it starts over (its children stay in their vectors).
const maxCachedChildren = 4096

// childCache keeps a vector's children by their label values, so that a
// request finds the series it counts into with one map lookup instead of
// WithLabelValues (hashing and validating every label value under the
// vector's lock), several times a request. Reads take no lock: the map is
// replaced, never written, under seriesCache.mu.
type childCache[K comparable, V any] struct {
	m atomic.Pointer[map[K]V]
}

// load returns k's child, if cached.
func (c *childCache[K, V]) load(k K) (V, bool) {
	if m := c.m.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// get returns k's child, made with create (WithLabelValues, which makes
// the series if it is missing, as before the cache) on a miss.
func (c *childCache[K, V]) get(mu *sync.Mutex, k K, create func() V) V {
	if v, ok := c.load(k); ok {
		return v
	}
	mu.Lock()
	defer mu.Unlock()
	if v, ok := c.load(k); ok {
		return v
	}
	v := create()
	old := c.m.Load()
	n := make(map[K]V, 1)
	if old != nil && len(*old) < maxCachedChildren {
		n = make(map[K]V, len(*old)+1)
		for ok, ov := range *old {
			n[ok] = ov
		}
	}
	n[k] = v
	c.m.Store(&n)
	return v
}

// drop removes the children whose key gone says; the caller holds the
// seriesCache's lock.
func (c *childCache[K, V]) drop(gone func(K) bool) {
	old := c.m.Load()
	if old == nil {
		return
	}
	n := make(map[K]V, len(*old))
	for k, v := range *old {
		if !gone(k) {
			n[k] = v
		}
	}
	c.m.Store(&n)
}

// requestKey is llmlb_requests_total's label values, before label().
type requestKey struct {
	replica string
	reason  balancer.Reason
	code    int
}

// completionKey is a model label (Metrics.ModelLabel) and a route reason.
type completionKey struct {
	model string
	route balancer.Reason
}

// completionSeries are the client-facing series of one model and route.
type completionSeries struct {
	ttft, duration             prometheus.Observer
	prompt, cached, completion prometheus.Counter
}

// seriesCache holds the children the per-request events count into.
// Replica series are dropped from it, under mu, before ForgetReplica
// deletes them, so no cached child of a forgotten replica outlives its
// series; a request that had already looked its child up counts into the
// deleted series, as it did between WithLabelValues and Inc before.
type seriesCache struct {
	mu           sync.Mutex
	requests     childCache[requestKey, prometheus.Counter]
	firstByte    childCache[string, prometheus.Observer]
	promptTokens childCache[string, prometheus.Counter]
	cachedTokens childCache[string, prometheus.Counter]
	expectedTTFT childCache[string, prometheus.Observer]
	completions  childCache[completionKey, *completionSeries]
}

// forget drops the children of the replica labelled r; the caller holds
// mu and then deletes its series.
func (c *seriesCache) forget(r string) {
	c.requests.drop(func(k requestKey) bool { return label(k.replica) == r })
	byName := func(k string) bool { return label(k) == r }
	c.firstByte.drop(byName)
	c.promptTokens.drop(byName)
	c.cachedTokens.drop(byName)
	c.expectedTTFT.drop(byName)
}

// knownRoute reports whether route's client-facing series are made with
// a model's (initModel), so that making them all at once for the cache
// makes no series that would not exist anyway.
func knownRoute(route balancer.Reason) bool {
	for _, r := range routeReasons {
		if string(route) == r {
			return true
		}
	}
	return false
}
