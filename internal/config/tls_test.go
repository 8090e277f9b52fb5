package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// selfSigned writes a self-signed certificate and its key into dir.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "llmlb"},
		NotBefore: time.Unix(0, 0), NotAfter: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func TestValidateTLS(t *testing.T) {
	dir := t.TempDir()
	cert, key := selfSigned(t, dir)
	other, _ := selfSigned(t, t.TempDir())
	tests := []struct {
		name   string
		modify func(*Config)
		want   []string // message prefixes, in order
	}{
		{"a loadable pair", func(c *Config) { c.Server.TLS = TLS{CertFile: cert, KeyFile: key} }, nil},
		{"admin listener too", func(c *Config) { c.Admin.TLS = TLS{CertFile: cert, KeyFile: key} }, nil},
		{"h2c without tls", func(c *Config) { c.Server.H2c = true }, nil},
		{"key missing", func(c *Config) { c.Server.TLS = TLS{CertFile: cert} },
			[]string{"config: server.tls.key_file: missing: server.tls.cert_file is set"}},
		{"cert missing", func(c *Config) { c.Admin.TLS = TLS{KeyFile: key} },
			[]string{"config: admin.tls.cert_file: missing: admin.tls.key_file is set"}},
		{"file absent", func(c *Config) { c.Server.TLS = TLS{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: key} },
			[]string{"config: server.tls.cert_file: cannot load the certificate with server.tls.key_file"}},
		{"key of another certificate", func(c *Config) { c.Server.TLS = TLS{CertFile: other, KeyFile: key} },
			[]string{"config: server.tls.cert_file: cannot load the certificate with server.tls.key_file"}},
		{"h2c with tls", func(c *Config) { c.Server.TLS, c.Server.H2c = TLS{CertFile: cert, KeyFile: key}, true },
			[]string{"config: server.h2c: cleartext HTTP/2 needs a cleartext listener"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.modify(&c)
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

func TestParseTLSKeys(t *testing.T) {
	c, err := Parse([]byte("server:\n  h2c: true\n  tls:\n    cert_file: /etc/llmlb/tls.crt\n    key_file: /etc/llmlb/tls.key\nadmin:\n  tls:\n    cert_file: a.crt\n    key_file: a.key\n"), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := TLS{CertFile: "/etc/llmlb/tls.crt", KeyFile: "/etc/llmlb/tls.key"}
	if c.Server.TLS != want || !c.Server.H2c || c.Admin.TLS != (TLS{CertFile: "a.crt", KeyFile: "a.key"}) {
		t.Errorf("parsed server %+v admin %+v", c.Server, c.Admin.TLS)
	}
}
