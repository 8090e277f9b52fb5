package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/llmlb/llmlb/internal/config"
)

// CertCheckInterval is how often the certificate files are read to see
// whether their content changed (cert-manager and Kubernetes swap Secret
// files in place).
const CertCheckInterval = 5 * time.Second

// certSource serves a listener's certificate from files and swaps it
// atomically on Reload: handshakes after the swap get the new pair,
// connections already open keep theirs and are not dropped.
type certSource struct {
	what     string // "proxy" or "admin", for logs
	cfg      config.TLS
	cert     atomic.Pointer[tls.Certificate]
	mu       sync.Mutex // serialises loads (SIGHUP and the file watch)
	certPEM  []byte     // the files' content at the last successful load
	keyPEM   []byte
	lastErr  string // the last load error, logged once by the watch
	log      *slog.Logger
	reloaded func(what string, ok bool) // counts reloads (nil: none)
}

// newCertSource loads cfg's pair once; it fails if the pair does not load.
func newCertSource(what string, cfg config.TLS, logger *slog.Logger) (*certSource, error) {
	c := &certSource{what: what, cfg: cfg, log: logger}
	if _, err := c.load(); err != nil {
		return nil, fmt.Errorf("server: %s tls: %w", what, err)
	}
	return c, nil
}

// load reads both files and, when their content differs from the last
// load, parses and swaps the pair in. changed is false when nothing
// changed; a pair that does not load leaves the current one in place.
func (c *certSource) load() (changed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	certPEM, err := os.ReadFile(c.cfg.CertFile)
	if err != nil {
		return false, fmt.Errorf("cert_file: %w", err)
	}
	keyPEM, err := os.ReadFile(c.cfg.KeyFile)
	if err != nil {
		return false, fmt.Errorf("key_file: %w", err)
	}
	if c.cert.Load() != nil && bytes.Equal(certPEM, c.certPEM) && bytes.Equal(keyPEM, c.keyPEM) {
		return false, nil
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		// A rotation writes the two files one after the other: the next
		// look sees them matching again.
		return false, fmt.Errorf("cert_file and key_file do not load as a pair: %w", err)
	}
	c.certPEM, c.keyPEM = certPEM, keyPEM
	c.cert.Store(&pair)
	return true, nil
}

// Reload re-reads the files and logs the outcome: a new pair at INFO,
// one that does not load at ERROR (the old pair stays). quiet skips an
// error already logged (the file watch looks every few seconds).
func (c *certSource) Reload(quiet bool) {
	changed, err := c.load()
	c.mu.Lock()
	repeated := err != nil && err.Error() == c.lastErr
	c.lastErr = ""
	if err != nil {
		c.lastErr = err.Error()
	}
	c.mu.Unlock()
	if quiet && repeated {
		return
	}
	switch {
	case err != nil:
		c.log.Error("tls: certificate not reloaded, keeping the current one",
			slog.String("listener", c.what), slog.String("error", err.Error()))
	case changed:
		leaf := c.cert.Load().Leaf
		attrs := []any{slog.String("listener", c.what), slog.String("cert_file", c.cfg.CertFile)}
		if leaf != nil {
			attrs = append(attrs, slog.Time("not_after", leaf.NotAfter))
		}
		c.log.Info("tls: certificate reloaded", attrs...)
	}
	if c.reloaded != nil && (err != nil || changed) {
		c.reloaded(c.what, err == nil)
	}
}

// GetCertificate is tls.Config.GetCertificate: the current pair.
func (c *certSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cert.Load(), nil
}

// TLSConfig is the listener's configuration: TLS 1.2 or later, HTTP/2
// offered before HTTP/1.1 by ALPN.
func (c *certSource) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.GetCertificate,
		NextProtos:     []string{"h2", "http/1.1"},
	}
}

// watch reloads the pair each time the files' content changes, every
// interval until ctx ends.
func (c *certSource) watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.Reload(true)
		}
	}
}
