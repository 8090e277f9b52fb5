// Package sharedstate shares the routing core's affinity state between
// several llmlb instances (`serve`, `epp`) through Redis (docs/SHARED_STATE.md,
// docs/SHARED_STATE.md): pins and the blocks each replica was sent travel as Deltas on
// one Redis stream, in-flight loads as short-lived entries on the same
// stream. Routing never waits for Redis: the core publishes into a bounded
// queue that one writer drains, and one reader applies the peers' Deltas
// under the core's lock. Redis slow or down costs the hints, never a request.
package sharedstate

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config is the `state:` section of the configuration. Sharing is off while
// RedisURL is empty.
type Config struct {
	// RedisURL is the Redis server, redis://[user:password@]host:port/db or
	// rediss:// for TLS (state.redis_url; state.redis_url_env names an
	// environment variable holding it). "" = no shared state.
	RedisURL string
	// KeyPrefix starts every Redis key llmlb uses (state.key_prefix,
	// "llmlb:"): instances that share a prefix share state, so one Redis
	// can serve several independent fleets.
	KeyPrefix string
	// InstanceID names this instance to its peers (state.instance_id;
	// default host name, process id and a random suffix). Two instances
	// must never share one.
	InstanceID string
	// OpTimeout bounds each Redis round trip (state.op_timeout, 50ms);
	// a slower Redis counts as down for that operation.
	OpTimeout time.Duration
	// LoadInterval is how often the instance publishes its in-flight
	// requests per replica (state.load_interval, 250ms), and LoadTTL how
	// long peers count them without a refresh (state.load_ttl, 2s): the
	// load of an instance that died stops counting after LoadTTL.
	LoadInterval time.Duration
	LoadTTL      time.Duration
	// ShareLoad publishes this instance's in-flight requests and adds the
	// peers' to the effective load (state.share_load, true). Off, only
	// pins and the block index are shared: better with policy llmlb, whose
	// least-loaded choice herds on a shared view (BENCHMARKS.md).
	ShareLoad bool
	// QueueSize bounds the changes waiting to be written (state.queue_size,
	// 8192); beyond it changes are dropped and counted, routing goes on.
	QueueSize int
	// StreamMaxLen is about how many changes the stream keeps for late
	// joiners and reconnects (state.stream_max_len, 10000; Redis trims
	// approximately). A blocks record is 8 bytes a block.
	StreamMaxLen int64
	// ReplayWindow is how far back a starting instance reads the stream
	// (state.replay_window, 5m): older pins are left to expire.
	ReplayWindow time.Duration
}

// DefaultConfig returns the defaults (sharing off: no RedisURL).
func DefaultConfig() Config {
	return Config{
		KeyPrefix:    "llmlb:",
		OpTimeout:    50 * time.Millisecond,
		LoadInterval: 250 * time.Millisecond,
		LoadTTL:      2 * time.Second,
		ShareLoad:    true,
		QueueSize:    8192,
		StreamMaxLen: 10_000,
		ReplayWindow: 5 * time.Minute,
	}
}

// Enabled reports whether shared state is configured.
func (c Config) Enabled() bool { return c.RedisURL != "" }

// Validate reports every bad setting, naming its key (state.*).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("state.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.RedisURL != "" {
		if _, err := redis.ParseURL(c.RedisURL); err != nil {
			// The URL may hold a password: name the problem, not the URL.
			bad("redis_url", "not a Redis URL (want redis://host:port/db or rediss://...): %s", redactErr(err, c.RedisURL))
		}
	}
	if strings.ContainsAny(c.KeyPrefix, " \t\r\n") {
		bad("key_prefix", "must not contain white space, got %q", c.KeyPrefix)
	}
	if c.OpTimeout <= 0 {
		bad("op_timeout", "must be > 0, got %s", c.OpTimeout)
	}
	if c.LoadInterval <= 0 {
		bad("load_interval", "must be > 0, got %s", c.LoadInterval)
	}
	if c.LoadTTL <= c.LoadInterval {
		bad("load_ttl", "must be longer than state.load_interval (%s), got %s", c.LoadInterval, c.LoadTTL)
	}
	if c.QueueSize < 1 {
		bad("queue_size", "must be >= 1, got %d", c.QueueSize)
	}
	if c.StreamMaxLen < 1 {
		bad("stream_max_len", "must be >= 1, got %d", c.StreamMaxLen)
	}
	if c.ReplayWindow < 0 {
		bad("replay_window", "must be >= 0, got %s", c.ReplayWindow)
	}
	return errors.Join(errs...)
}

// redactErr is err's text with the URL's password removed.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		if userinfo, _, ok := strings.Cut(rest, "@"); ok && userinfo != "" {
			msg = strings.ReplaceAll(msg, userinfo, "<redacted>")
		}
	}
	return msg
}

// streamKey is the Redis stream all instances of a prefix write and read.
func (c Config) streamKey() string { return c.KeyPrefix + "affinity" }
