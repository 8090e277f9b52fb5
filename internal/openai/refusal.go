package openai

import "net/http"

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
