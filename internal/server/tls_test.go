package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/simreplica"
)

// starter runs n simulated replicas and llmlb in front of them (start, or
// startH2 for the same over TLS and HTTP/2).
type starter func(t *testing.T, n int, tweak func(*config.Config), opts ...Option) *env

// overBoth runs an end-to-end test with a cleartext HTTP/1.1 client and
// again with Go's HTTP/2 client over TLS.
func overBoth(t *testing.T, test func(*testing.T, starter)) {
	t.Run("http1", func(t *testing.T) { test(t, start) })
	t.Run("h2", func(t *testing.T) { test(t, startH2) })
}

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "llmlb test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a leaf certificate for 127.0.0.1 and localhost with the
// given serial number, and its key, to certFile and keyFile.
func (ca *testCA) issue(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "llmlb"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	writeFile(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
}

// writeFile replaces path's content by renaming a new file over it, as
// cert-manager and Kubernetes do.
func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsFiles are a test CA and the files of a leaf it signed.
type tlsFiles struct {
	ca                *testCA
	cert, key, caFile string
}

func newTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	f := tlsFiles{ca: newTestCA(t), cert: filepath.Join(dir, "tls.crt"), key: filepath.Join(dir, "tls.key"), caFile: filepath.Join(dir, "ca.crt")}
	f.ca.issue(t, 100, f.cert, f.key)
	writeFile(t, f.caFile, f.ca.pem)
	return f
}

// h2Only fails every HTTPS exchange that is not HTTP/2, so a test run
// with startH2 cannot pass over HTTP/1.1 by accident.
type h2Only struct{ next http.RoundTripper }

func (h h2Only) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := h.next.RoundTrip(req)
	if err == nil && req.URL.Scheme == "https" && res.ProtoMajor != 2 {
		res.Body.Close()
		return nil, errors.New("test: the proxy answered over " + res.Proto + ", want HTTP/2")
	}
	return res, err
}

// startH2 is start with the proxy listener on TLS and the client speaking
// HTTP/2 to it (ALPN), trusting a CA made for the test.
func startH2(t *testing.T, n int, tweak func(*config.Config), opts ...Option) *env {
	t.Helper()
	files := newTLSFiles(t)
	e := start(t, n, func(c *config.Config) {
		c.Server.TLS = config.TLS{CertFile: files.cert, KeyFile: files.key}
		if tweak != nil {
			tweak(c)
		}
	}, opts...)
	e.proxy = "https://" + e.srv.ProxyAddr()
	e.http = &http.Client{Transport: h2Only{&http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: files.ca.pool},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 64,
	}}}
	return e
}

func TestStreamOverBoth(t *testing.T) {
	overBoth(t, func(t *testing.T, start starter) {
		e := start(t, 2, nil)
		_, finish := e.stream(context.Background(), 20, "stream")
		chunks, err := finish()
		if err != nil || chunks < 2 {
			t.Fatalf("stream: %d chunks, %v; want the whole stream in several chunks", chunks, err)
		}
	})
}

func TestFirstByteTimeoutOverBoth(t *testing.T) {
	overBoth(t, func(t *testing.T, start starter) {
		// Scrapes say the hung replica is fine: only the deadline ends the wait.
		fake, setIdle := idleFleet()
		e := start(t, 1, func(c *config.Config) {
			setIdle(c)
			c.Proxy.FirstByteTimeout = 300 * time.Millisecond
			c.Proxy.MaxAttempts = 1
		}, WithFetcher(fake))
		if err := e.fleet.Replicas[0].SetFault(simreplica.Fault{Mode: simreplica.Hang}); err != nil {
			t.Fatal(err)
		}
		code, _, body := e.chat(chatBody("hi", 2), nil)
		if code != http.StatusGatewayTimeout {
			t.Errorf("got %d %s, want 504 after proxy.first_byte_timeout", code, body)
		}
	})
}

// serial dials addr with TLS and returns the serial number of the
// certificate the server presents.
func serial(t *testing.T, addr string, pool *x509.CertPool) int64 {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.Int64()
}

func TestCertificateReloadKeepsStreams(t *testing.T) {
	files := newTLSFiles(t)
	e := start(t, 1, func(c *config.Config) {
		c.Server.TLS = config.TLS{CertFile: files.cert, KeyFile: files.key}
	})
	e.proxy = "https://" + e.srv.ProxyAddr()
	e.http = &http.Client{Transport: h2Only{&http.Transport{TLSClientConfig: &tls.Config{RootCAs: files.ca.pool}, ForceAttemptHTTP2: true}}}
	addr := e.srv.ProxyAddr()
	if got := serial(t, addr, files.ca.pool); got != 100 {
		t.Fatalf("serial %d at start, want 100", got)
	}
	_, finish := e.stream(context.Background(), 200, "held")

	// SIGHUP: the new pair for new handshakes, the open stream goes on.
	files.ca.issue(t, 101, files.cert, files.key)
	e.srv.ReloadCertificates()
	if got := serial(t, addr, files.ca.pool); got != 101 {
		t.Errorf("serial %d after the reload, want 101", got)
	}
	// A pair that does not load is refused; the current one stays.
	writeFile(t, files.key, []byte("not a key"))
	e.srv.ReloadCertificates()
	if got := serial(t, addr, files.ca.pool); got != 101 {
		t.Errorf("serial %d after a broken key, want 101 kept", got)
	}
	// A changed file is picked up without a signal.
	files.ca.issue(t, 102, files.cert, files.key)
	deadline := time.Now().Add(waitFor)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for serial(t, addr, files.ca.pool) != 102 {
		if time.Now().After(deadline) {
			t.Fatal("the changed certificate files were not reloaded")
		}
		<-tick.C
	}
	if chunks, err := finish(); err != nil {
		t.Errorf("the stream open across the reloads ended with %v after %d chunks", err, chunks)
	}
}

func TestAdminOverTLS(t *testing.T) {
	files := newTLSFiles(t)
	cfg := testConfig()
	cfg.Admin.TLS = config.TLS{CertFile: files.cert, KeyFile: files.key}
	srv, err := New(cfg, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	srv.UseListeners(listen(t), listen(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: files.ca.pool}, ForceAttemptHTTP2: true}}
	res, err := c.Get("https://" + srv.AdminAddr() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.TLS == nil {
		t.Errorf("admin /healthz over TLS: %d, tls %v", res.StatusCode, res.TLS != nil)
	}
}

func TestCleartextHTTP2(t *testing.T) {
	e := start(t, 1, func(c *config.Config) { c.Server.H2c = true })
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &p}}
	for _, c := range []struct {
		name      string
		client    *http.Client
		wantMajor int
	}{
		{"prior knowledge", h2c, 2},
		{"http/1.1 as before", &http.Client{}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := c.client.Post(e.proxy+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("hi", 2)))
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if _, err := io.ReadAll(res.Body); err != nil {
				t.Fatal(err)
			}
			if res.StatusCode != http.StatusOK || res.ProtoMajor != c.wantMajor {
				t.Errorf("got %d over %s, want 200 over HTTP/%d", res.StatusCode, res.Proto, c.wantMajor)
			}
		})
	}
}

// TestCurlHTTP2 checks HTTP/2 with another client than Go's: curl, over
// TLS (ALPN) and over cleartext (h2c, prior knowledge).
func TestCurlHTTP2(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl is not installed: the HTTP/2 checks with curl are skipped (Go's HTTP/2 client covers the rest)")
	}
	files := newTLSFiles(t)
	tlsEnv := start(t, 1, func(c *config.Config) { c.Server.TLS = config.TLS{CertFile: files.cert, KeyFile: files.key} })
	h2cEnv := start(t, 1, func(c *config.Config) { c.Server.H2c = true })
	for _, c := range []struct {
		name string
		args []string
	}{
		{"tls json", []string{"--http2", "--cacert", files.caFile, "https://" + tlsEnv.srv.ProxyAddr() + "/v1/chat/completions", "-d", chatBody("hi", 2)}},
		{"tls sse", []string{"--http2", "-N", "--cacert", files.caFile, "https://" + tlsEnv.srv.ProxyAddr() + "/v1/chat/completions", "-d", strings.Replace(chatBody("hi", 5), "{", `{"stream":true,`, 1)}},
		{"h2c json", []string{"--http2-prior-knowledge", h2cEnv.proxy + "/v1/chat/completions", "-d", chatBody("hi", 2)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"-sS", "-H", "Content-Type: application/json", "-w", "\nHTTP/%{http_version} %{http_code}"}, c.args...)
			out, err := exec.Command(curl, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("curl: %v\n%s", err, out)
			}
			s := string(out)
			if !strings.HasSuffix(s, "HTTP/2 200") || !strings.Contains(s, "choices") {
				t.Errorf("curl got:\n%s\nwant an answer over HTTP/2 with status 200", s)
			}
		})
	}
}

func TestSlowBodyOverBoth(t *testing.T) {
	overBoth(t, func(t *testing.T, start starter) {
		e := start(t, 1, func(c *config.Config) { c.Server.ReadBodyTimeout = 300 * time.Millisecond })
		// The body starts and never ends: the deadline answers 408, over
		// HTTP/2 as over HTTP/1.1 (a stream's own read deadline there).
		pr, pw := io.Pipe()
		defer pw.Close()
		go func() { _, _ = pw.Write([]byte(`{"model":"` + model + `","messages":[`)) }()
		res, err := e.http.Post(e.proxy+"/v1/chat/completions", "application/json", pr)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusRequestTimeout {
			b, _ := io.ReadAll(res.Body)
			t.Errorf("got %d %s, want 408 after server.read_body_timeout", res.StatusCode, b)
		}
	})
}
