package proxy

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/llmlb/llmlb/internal/keyname"
)

// Config configures request handling (proxy: in YAML).
type Config struct {
	MaxBodyBytes      int64         // proxy.max_body_bytes (32 MiB)
	MaxAttempts       int           // proxy.max_attempts: tries before the first byte, on distinct replicas (3)
	RouteHeaders      bool          // proxy.route_headers: X-LLMLB-Replica / X-LLMLB-Route (true)
	ConnectTimeout    time.Duration // proxy.connect_timeout (5s)
	FirstByteTimeout  time.Duration // proxy.first_byte_timeout: response headers deadline (10m; 504 after)
	PassAuthorization bool          // proxy.pass_authorization: forward the client's Authorization when the replica has no api_key (true)
	StreamIdleTimeout time.Duration // proxy.stream_idle_timeout: longest silence of a replica during a stream, and before the answer to a streaming request (60s)
	// RetryStatuses are the replica answers tried again on another replica
	// (within max_attempts) instead of passed to the client: a replica that
	// is busy or unavailable answers them before computing anything
	// (proxy.retry_statuses: 429, 502, 503).
	RetryStatuses []int
}

// DefaultConfig returns the proxy section's defaults, those of the
// comments above.
func DefaultConfig() Config {
	return Config{
		MaxBodyBytes:      DefaultMaxBodyBytes,
		MaxAttempts:       DefaultMaxAttempts,
		RouteHeaders:      true,
		ConnectTimeout:    DefaultConnectTimeout,
		FirstByteTimeout:  DefaultFirstByteTimeout,
		PassAuthorization: true,
		StreamIdleTimeout: DefaultStreamIdleTimeout,
		RetryStatuses:     slices.Clone(DefaultRetryStatuses),
	}
}

// Validate reports every problem of the proxy section at once
// (errors.Join), each a *keyname.Error naming its key
// (proxy.max_attempts).
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, keyname.Errorf(key, format, args...))
	}
	positive := func(key string, d time.Duration) {
		if d <= 0 {
			bad(key, "must be > 0, got %s", d)
		}
	}
	positiveInt := func(key string, n int64) {
		if n <= 0 {
			bad(key, "must be > 0, got %d", n)
		}
	}
	positiveInt("proxy.max_body_bytes", c.MaxBodyBytes)
	positiveInt("proxy.max_attempts", int64(c.MaxAttempts))
	positive("proxy.connect_timeout", c.ConnectTimeout)
	positive("proxy.first_byte_timeout", c.FirstByteTimeout)
	positive("proxy.stream_idle_timeout", c.StreamIdleTimeout)
	for i, s := range c.RetryStatuses {
		if s < 400 || s > 599 {
			bad(fmt.Sprintf("proxy.retry_statuses[%d]", i), "%d is not an error status (400-599): only a replica's refusal is tried elsewhere", s)
		}
	}
	return errors.Join(errs...)
}
