package proxy

import (
	"net/http"
	"reflect"
	"testing"
)

// TestSetCredentials: a replica's api key replaces every credential header
// a client may send (Authorization, x-api-key, api-key); none of the
// client's own keys reaches the replica.
func TestSetCredentials(t *testing.T) {
	client := func() http.Header {
		return http.Header{
			"Authorization": {"Bearer sk-client"},
			"X-Api-Key":     {"sk-ant-client"},
			"Api-Key":       {"azure-client"},
			"Content-Type":  {"application/json"},
		}
	}
	tests := []struct {
		name string
		in   http.Header
		key  string
		pass bool
		want http.Header
	}{
		{"a key replaces all three", client(), "sk-replica", true, http.Header{
			"Authorization": {"Bearer sk-replica"}, "X-Api-Key": {"sk-replica"}, "Api-Key": {"sk-replica"}, "Content-Type": {"application/json"}}},
		{"a key replaces them with pass off", client(), "sk-replica", false, http.Header{
			"Authorization": {"Bearer sk-replica"}, "X-Api-Key": {"sk-replica"}, "Api-Key": {"sk-replica"}, "Content-Type": {"application/json"}}},
		{"a key adds only Authorization to a request without credentials", http.Header{"Content-Type": {"application/json"}}, "sk-replica", true, http.Header{
			"Authorization": {"Bearer sk-replica"}, "Content-Type": {"application/json"}}},
		{"an x-api-key alone is replaced", http.Header{"X-Api-Key": {"sk-ant-client"}}, "sk-replica", true, http.Header{
			"Authorization": {"Bearer sk-replica"}, "X-Api-Key": {"sk-replica"}}},
		{"no key, pass on: the client's go on", client(), "", true, client()},
		{"no key, pass off: none goes on", client(), "", false, http.Header{"Content-Type": {"application/json"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			setCredentials(tc.in, tc.key, tc.pass)
			if !reflect.DeepEqual(tc.in, tc.want) {
				t.Fatalf("headers %v, want %v", tc.in, tc.want)
			}
		})
	}
}
