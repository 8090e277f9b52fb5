// Package canned is an http.RoundTripper for benchmarks that answers every
// request in memory with one fixed JSON body, so a handler's own work per
// request is measured without sockets.
package canned

import (
	"io"
	"net/http"
	"strings"
)

// Transport reads and closes each request's body and answers 200 with
// Body as application/json.
type Transport struct{ Body string }

// RoundTrip implements http.RoundTripper.
func (t Transport) RoundTrip(r *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, r.Body)
	_ = r.Body.Close()
	return &http.Response{
		StatusCode:    http.StatusOK,
		Header:        http.Header{"Content-Type": {"application/json"}},
		Body:          io.NopCloser(strings.NewReader(t.Body)),
		ContentLength: int64(len(t.Body)),
		Request:       r,
	}, nil
}
