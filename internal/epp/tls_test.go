package epp_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/llmlb/llmlb/internal/epp"
)

// testCert is a key and its certificate, signed by parent (nil: itself).
type testCert struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
	der  []byte
}

func newTestCert(t *testing.T, name string, ca bool, parent *testCert) *testCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		IsCA:         ca, BasicConstraintsValid: true,
	}
	signer, signKey := tmpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCert{key: key, cert: c, der: der}
}

// files writes the certificate and key as PEM files in dir.
func (c *testCert) files(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	kb, err := x509.MarshalECPrivateKey(c.key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func (c *testCert) pair() tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{c.der}, PrivateKey: c.key}
}

// TestEPPMutualTLS: with LoadTLS's configuration and a client CA, the gRPC
// port serves only clients presenting a certificate of that CA; one
// without a certificate, with another CA's, or in cleartext fails before
// any call is served.
func TestEPPMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCert(t, "ca", true, nil)
	other := newTestCert(t, "other-ca", true, nil)
	server := newTestCert(t, "picker", false, ca)
	gateway := newTestCert(t, "gateway", false, ca)
	stranger := newTestCert(t, "stranger", false, other)
	caFile, _ := ca.files(t, dir, "ca")
	certFile, keyFile := server.files(t, dir, "server")

	cfg, err := epp.LoadTLS(certFile, keyFile, caFile)
	if err != nil {
		t.Fatal(err)
	}
	r := startPicker(t, epp.Options{TLS: cfg})
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	withCert := func(c *testCert) credentials.TransportCredentials {
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if c != nil {
			tc.Certificates = []tls.Certificate{c.pair()}
		}
		return credentials.NewTLS(tc)
	}
	tests := []struct {
		name  string
		creds credentials.TransportCredentials
		ok    bool
	}{
		{"the gateway's certificate", withCert(gateway), true},
		{"no client certificate", withCert(nil), false},
		{"another CA's certificate", withCert(stranger), false},
		{"cleartext", insecure.NewCredentials(), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn := r.dial(t, grpc.WithTransportCredentials(tc.creds))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: epp.ServiceLiveness})
			if tc.ok && err != nil {
				t.Fatalf("refused: %v", err)
			}
			if !tc.ok && err == nil {
				t.Fatal("served")
			}
		})
	}
}

// TestLoadTLSErrors: files that do not make a configuration are clear errors.
func TestLoadTLSErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newTestCert(t, "ca", true, nil)
	certFile, keyFile := ca.files(t, dir, "ca")
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name                string
		cert, key, clientCA string
	}{
		{"no key", certFile, "", ""},
		{"missing certificate", filepath.Join(dir, "none.crt"), keyFile, ""},
		{"client CA not PEM", certFile, keyFile, junk},
		{"client CA missing", certFile, keyFile, filepath.Join(dir, "none.pem")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := epp.LoadTLS(tc.cert, tc.key, tc.clientCA); err == nil {
				t.Fatal("no error")
			}
		})
	}
	if _, err := epp.LoadTLS(certFile, keyFile, ""); err != nil {
		t.Fatalf("server TLS without a client CA: %v", err)
	}
}
