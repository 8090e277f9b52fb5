package config

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestEPPKeys: epp.max_in_flight_per_replica and
// epp.max_exchanges_per_connection have their defaults, parse from YAML and
// name themselves when invalid.
func TestEPPKeys(t *testing.T) {
	if d := Default().EPP; d.MaxInFlightPerReplica != 1024 || d.MaxExchangesPerConnection != 256 {
		t.Fatalf("defaults: max_in_flight_per_replica %d, max_exchanges_per_connection %d; want 1024, 256",
			d.MaxInFlightPerReplica, d.MaxExchangesPerConnection)
	}
	tests := []struct {
		name          string
		yaml          string
		perReplica    int
		perConnection int
		errs          []string
	}{
		{"set", "epp:\n  max_in_flight_per_replica: 64\n  max_exchanges_per_connection: 32\n", 64, 32, nil},
		{"zero", "epp:\n  max_in_flight_per_replica: 0\n", 0, 256, []string{`config: epp.max_in_flight_per_replica: must be > 0, got 0`}},
		{"negative", "epp:\n  max_in_flight_per_replica: -3\n", -3, 256, []string{`config: epp.max_in_flight_per_replica: must be > 0, got -3`}},
		{"zero per connection", "epp:\n  max_exchanges_per_connection: 0\n", 1024, 0, []string{`config: epp.max_exchanges_per_connection: must be > 0, got 0`}},
		{"negative per connection", "epp:\n  max_exchanges_per_connection: -1\n", 1024, -1, []string{`config: epp.max_exchanges_per_connection: must be > 0, got -1`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(tc.yaml), "test.yaml")
			if err != nil {
				t.Fatal(err)
			}
			if c.EPP.MaxInFlightPerReplica != tc.perReplica || c.EPP.MaxExchangesPerConnection != tc.perConnection {
				t.Fatalf("parsed %d, %d; want %d, %d", c.EPP.MaxInFlightPerReplica, c.EPP.MaxExchangesPerConnection, tc.perReplica, tc.perConnection)
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
			tt.epp.MaxInFlightPerReplica, tt.epp.MaxExchangesPerConnection = 1, 1
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
