package config

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// FuzzParse: parsing never panics, whatever the bytes; what parses also
// validates without panicking and survives a Marshal/Parse round trip.
// Seeds: below and testdata/fuzz/FuzzParse.
// Run: go test -run '^$' -fuzz FuzzParse -fuzztime 60s -fuzzminimizetime 3s ./internal/config
// (a short minimize time: minimizing a large input can stall the run for a minute).
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"",
		"listen: \":8080\"\nreplicas:\n  - http://a:8000\n",
		"routing:\n  affinity: {session_ttl: 1h, prefix_ttl: 5m}\n",
		"replicas:\n  - &a {name: a, url: \"http://a:8000\", api_key_env: VLLM_KEY}\n  - <<: *a\n    name: b\n",
		"scrape: {max_body_bytes: 4MiB, interval: 3s}\n",
		"a: &x [*x]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parse(data, "fuzz.yaml", env)
		if err != nil {
			return
		}
		_ = c.Validate()
		out, err := Marshal(c)
		if err != nil {
			t.Fatalf("Marshal of a parsed config: %v", err)
		}
		again, err := parse(out, "marshalled", env)
		if err != nil {
			t.Fatalf("Parse(Marshal(c)): %v\n%s", err, out)
		}
		if d := cmp.Diff(c, again, cmpopts.EquateEmpty()); d != "" {
			t.Fatalf("round trip mismatch (-first +second):\n%s", d)
		}
	})
}
