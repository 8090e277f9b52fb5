package openai

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Error types of the errors the balancer itself produces.
const (
	// TypeInvalidRequest is the client's mistake (4xx).
	TypeInvalidRequest = "invalid_request_error"
	// TypeServer is the balancer's or a replica's failure (5xx).
	TypeServer = "server_error"
	// TypeUnavailable says no replica can take the request now.
	TypeUnavailable = "service_unavailable_error"
	// TypeTimeout says a replica did not answer in time.
	TypeTimeout = "timeout_error"
	// TypeRateLimit says the request was turned away for now (429): retry
	// after the answer's Retry-After.
	TypeRateLimit = "rate_limit_error"
)

// Error codes of the errors the balancer itself produces.
const (
	// CodeInvalidJSON is a body that cannot be read or parsed.
	CodeInvalidJSON = "invalid_request"
	// CodeTooLarge is a body over the size limit.
	CodeTooLarge = "request_too_large"
	// CodeBodyTimeout is a body not received in time.
	CodeBodyTimeout = "request_timeout"
	// CodeModelNotFound is a model no replica serves.
	CodeModelNotFound = "model_not_found"
	// CodeNotFound is a path outside the API.
	CodeNotFound = "not_found"
	// CodeInvalidPath is a path that is malformed or has dot segments.
	CodeInvalidPath = "invalid_path"
	// CodeNoHealthyInstances says no healthy replica is available.
	CodeNoHealthyInstances = "no_healthy_instances"
	// CodeUpstreamTimeout is a replica that did not answer in time.
	CodeUpstreamTimeout = "upstream_timeout"
	// CodeUpstreamError is a replica's failure before any answer.
	CodeUpstreamError = "upstream_error"
	// CodeStreamBroken ends a stream that broke after its first byte.
	CodeStreamBroken = "upstream_stream_broken"
	// CodeInternal is the balancer's own failure.
	CodeInternal = "internal_error"

	// Flow control's answers (429 with Retry-After, but CodeShuttingDown:
	// 503) and its one client error (400).

	// CodeQueueFull: the model's queue holds flow_control.max_queued
	// requests or max_queued_bytes of bodies.
	CodeQueueFull = "queue_full"
	// CodeShed: a sheddable request (priority below 0) while every replica
	// of its model is full.
	CodeShed = "shed"
	// CodeTenantLimit: the tenant is at its concurrency or tokens-per-minute
	// limit.
	CodeTenantLimit = "tenant_limit"
	// CodeQueueTimeout: no replica had room within flow_control.max_queue_time
	// (standing_queue_time under a standing backlog).
	CodeQueueTimeout = "queue_timeout"
	// CodeShuttingDown: the balancer stopped while the request waited.
	CodeShuttingDown = "shutting_down"
	// CodeInvalidPriority: an X-LLMLB-Priority header that is not an integer.
	CodeInvalidPriority = "invalid_priority"
	// CodeLoopDetected: the request came back to the llmlb that forwarded
	// it (a replica URL that is llmlb itself); 508.
	CodeLoopDetected = "loop_detected"
)

// RetryAfter is the Retry-After header's value for a wait of d: whole
// seconds, rounded up, at least 1.
func RetryAfter(d time.Duration) string {
	s := int64(math.Ceil(d.Seconds()))
	return strconv.FormatInt(max(s, 1), 10)
}

// ErrorBody is OpenAI's error shape: {"error":{"message","type","code"}}.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of ErrorBody.
type ErrorDetail struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// ErrorJSON is the error body of typ, code and msg, ending in a newline.
func ErrorJSON(typ, code, msg string) []byte {
	b, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Message: msg, Type: typ, Code: code}})
	return append(b, '\n')
}

// WriteError answers with status and an OpenAI-shaped error body. A
// Content-Length set before (by a replica's answer being replaced) is
// dropped: it would not fit the new body.
func WriteError(w http.ResponseWriter, status int, typ, code, msg string) {
	b := ErrorJSON(typ, code, msg)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// StatusCode is the error code named after an HTTP status: its status
// text in lower case with underscores ("not_found", "bad_request").
func StatusCode(status int) string {
	return strings.ReplaceAll(strings.ToLower(http.StatusText(status)), " ", "_")
}

// WriteStatusError answers with status and an error body whose type
// follows the status's class (TypeServer for 5xx, TypeInvalidRequest
// otherwise) and whose code is StatusCode(status).
func WriteStatusError(w http.ResponseWriter, status int, msg string) {
	typ := TypeInvalidRequest
	if status >= 500 {
		typ = TypeServer
	}
	WriteError(w, status, typ, StatusCode(status), msg)
}

// ErrorEvent is the SSE event that ends a stream with an error: the error
// body as a data line, then the blank line that closes the event.
func ErrorEvent(typ, code, msg string) []byte {
	b, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Message: msg, Type: typ, Code: code}})
	return AppendEvent(make([]byte, 0, len(b)+len(eventPayload)+2), b)
}

// Answer is an error the balancer answers itself: the HTTP status and
// the fields of the body.
type Answer struct {
	Status     int
	Type, Code string
	Message    string
}

// ModelNotFound is the answer to a request for a model no replica serves.
func ModelNotFound(model string) Answer {
	return Answer{Status: http.StatusNotFound, Type: TypeInvalidRequest, Code: CodeModelNotFound,
		Message: fmt.Sprintf("the model %q does not exist on any replica", model)}
}

// ReplicaErrorBody is the error shape vLLM answers with:
// {"error":{"message","type","param","code"}}, the code being the HTTP
// status and the type a name of vLLM's (ReplicaErrorType).
type ReplicaErrorBody struct {
	Error ReplicaErrorDetail `json:"error"`
}

// ReplicaErrorDetail is the inner object of ReplicaErrorBody.
type ReplicaErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

// NewReplicaError is vLLM's error body for status with msg.
func NewReplicaError(status int, msg string) ReplicaErrorBody {
	return ReplicaErrorBody{Error: ReplicaErrorDetail{Message: msg, Type: ReplicaErrorType(status), Code: status}}
}

// ReplicaErrorType is the error type vLLM reports for a status.
func ReplicaErrorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLarge"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	default:
		if status >= 500 {
			return "InternalServerError"
		}
		return "BadRequestError"
	}
}
