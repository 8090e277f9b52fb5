package config

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEPPKeys: epp.max_in_flight_per_replica has its default, parses from
// YAML and names itself when invalid.
func TestEPPKeys(t *testing.T) {
	if got := Default().EPP.MaxInFlightPerReplica; got != 1024 {
		t.Fatalf("default epp.max_in_flight_per_replica %d, want 1024", got)
	}
	tests := []struct {
		name string
		yaml string
		want int
		errs []string
	}{
		{"set", "epp:\n  max_in_flight_per_replica: 64\n", 64, nil},
		{"zero", "epp:\n  max_in_flight_per_replica: 0\n", 0, []string{`config: epp.max_in_flight_per_replica: must be > 0, got 0`}},
		{"negative", "epp:\n  max_in_flight_per_replica: -3\n", -3, []string{`config: epp.max_in_flight_per_replica: must be > 0, got -3`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), "test.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if c.EPP.MaxInFlightPerReplica != tc.want {
				t.Fatalf("parsed %d, want %d", c.EPP.MaxInFlightPerReplica, tc.want)
			}
			if d := cmp.Diff(tc.errs, messages(c.Validate())); d != "" {
				t.Errorf("Validate mismatch (-want +got):\n%s", d)
			}
		})
	}
}
