package proxy

import (
	"encoding/json"
	"net/http"
)

// Error types and codes of the errors the balancer itself produces, in
// OpenAI's shape {"error":{"message","type","code"}} (SPEC s10).
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeServer         = "server_error"
	TypeUnavailable    = "service_unavailable_error"
	TypeTimeout        = "timeout_error"

	CodeInvalidJSON        = "invalid_request"
	CodeTooLarge           = "request_too_large"
	CodeBodyTimeout        = "request_timeout"
	CodeModelNotFound      = "model_not_found"
	CodeNotFound           = "not_found"
	CodeInvalidPath        = "invalid_path"
	CodeNoHealthyInstances = "no_healthy_instances"
	CodeUpstreamTimeout    = "upstream_timeout"
	CodeUpstreamError      = "upstream_error"
	CodeStreamBroken       = "upstream_stream_broken"
)

// ErrorBody is OpenAI's error shape.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inner object of ErrorBody.
type ErrorDetail struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    string `json:"code"`
}

// WriteError answers with status and an OpenAI-shaped error body.
func WriteError(w http.ResponseWriter, status int, typ, code, msg string) {
	b, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Message: msg, Type: typ, Code: code}})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// sseError is the SSE event that ends a stream broken mid-way.
func sseError(msg string) []byte {
	b, _ := json.Marshal(ErrorBody{Error: ErrorDetail{Message: msg, Type: TypeServer, Code: CodeStreamBroken}})
	out := make([]byte, 0, len(b)+10)
	out = append(out, "data: "...)
	out = append(out, b...)
	return append(out, "\n\n"...)
}

// writeJSON answers with status and v encoded as JSON.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		WriteError(w, http.StatusInternalServerError, TypeServer, "internal_error", "encoding the answer failed")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
