package openai

import (
	"math"
	"net/http"
	"strconv"
	"time"
)

// Flow control's answers (package flowcontrol): a request refused or held
// too long is answered 429 with Retry-After, one held when the balancer
// shuts down 503.
const (
	// TypeRateLimit says the balancer will not take the request now; the
	// client should retry after Retry-After (429).
	TypeRateLimit = "rate_limit_error"

	// CodeQueueFull: the queue holds its most requests or bytes.
	CodeQueueFull = "queue_full"
	// CodeShed: a sheddable request (priority below zero) while every
	// replica of its model is saturated.
	CodeShed = "shed"
	// CodeTenantLimit: the tenant's concurrency or token rate limit.
	CodeTenantLimit = "tenant_limit"
	// CodeQueueTimeout: the request waited flow_control.max_queue_time.
	CodeQueueTimeout = "queue_timeout"
	// CodeShuttingDown: the balancer shut down while the request waited.
	CodeShuttingDown = "shutting_down"
)

// Refusal is the answer to a request flow control refused or expired;
// code is one of the codes above (flowcontrol.Reason.Code() or
// CodeQueueTimeout). Send RetryAfter(d) as its Retry-After header.
func Refusal(code string) Answer {
	msg := "the request was not admitted"
	switch code {
	case CodeQueueFull:
		msg = "every replica is busy and the queue is full"
	case CodeShed:
		msg = "every replica is busy and the request's priority is sheddable"
	case CodeTenantLimit:
		msg = "the tenant's request or token limit is reached"
	case CodeQueueTimeout:
		msg = "every replica stayed busy for as long as a request may wait"
	}
	return Answer{Status: http.StatusTooManyRequests, Type: TypeRateLimit, Code: code, Message: msg}
}

// ShuttingDown is the answer to a request that waited in the queue when
// the balancer shut down.
func ShuttingDown() Answer {
	return Answer{Status: http.StatusServiceUnavailable, Type: TypeUnavailable, Code: CodeShuttingDown,
		Message: "the balancer is shutting down"}
}

// RetryAfter is d as a Retry-After header value: whole seconds, rounded
// up, at least 1.
func RetryAfter(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}
