package config

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// TestValidateEPPTLS: epp.tls and epp.client_ca_file name themselves when
// they cannot make the gRPC port's (mutual) TLS.
func TestValidateEPPTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		epp  EPP
		want []string // message prefixes, in order
	}{
		{"tls", EPP{TLS: TLS{CertFile: cert, KeyFile: key}}, nil},
		{"mutual tls", EPP{TLS: TLS{CertFile: cert, KeyFile: key}, ClientCAFile: cert}, nil},
		{"key missing", EPP{TLS: TLS{CertFile: cert}},
			[]string{"config: epp.tls.key_file: missing"}},
		{"client CA without tls", EPP{ClientCAFile: cert},
			[]string{"config: epp.client_ca_file: needs epp.tls.cert_file"}},
		{"client CA absent", EPP{TLS: TLS{CertFile: cert, KeyFile: key}, ClientCAFile: filepath.Join(dir, "none.pem")},
			[]string{"config: epp.client_ca_file: cannot read"}},
		{"client CA not PEM", EPP{TLS: TLS{CertFile: cert, KeyFile: key}, ClientCAFile: junk},
			[]string{"config: epp.client_ca_file: " + strconv.Quote(junk) + " holds no PEM certificate"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.epp.MaxInFlightPerReplica = 1
			c.EPP = tt.epp
			got := messages(c.Validate())
			if len(got) != len(tt.want) {
				t.Fatalf("got %q, want %d errors starting %q", got, len(tt.want), tt.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tt.want[i]) {
					t.Errorf("error %d: %q, want it to start %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}
