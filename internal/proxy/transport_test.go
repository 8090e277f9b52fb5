package proxy

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawUpstream serves each accepted connection with handle (a replica that
// speaks HTTP/1.1 by hand, for answers net/http's server cannot give).
func rawUpstream(t *testing.T, handle func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c, bufio.NewReader(c))
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readRequest reads one request and its body.
func readRequest(br *bufio.Reader) (*http.Request, error) {
	r, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	_, err = io.Copy(io.Discard, r.Body)
	return r, err
}

func postVia(t *testing.T, tr http.RoundTripper, url string) (*http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // bounds a hang only
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(chatBody)), nil }
	return tr.RoundTrip(req)
}

func readAll(t *testing.T, res *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

// TestConnTransport walks the proxy's own transport through what a replica
// may do to a kept-alive connection.
func TestConnTransport(t *testing.T) {
	t.Run("a connection closed while idle is replaced, the request sent once", func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			mu.Lock()
			got = append(got, string(b))
			mu.Unlock()
			io.WriteString(w, "ok")
		}))
		defer up.Close()
		wc := &writeCounter{}
		tr := newConnTransport(defaultProxyConfig())
		tr.dial = wc.dial
		for i := range 2 {
			res, err := postVia(t, tr, up.URL)
			if err != nil || res.StatusCode != http.StatusOK || readAll(t, res) != "ok" {
				t.Fatalf("request %d: %v", i, err)
			}
			up.CloseClientConnections() // uvicorn's keep-alive timeout, say
		}
		mu.Lock()
		defer mu.Unlock()
		if len(got) != 2 || wc.dials != 2 {
			t.Errorf("the replica got %d requests on %d connections, want 2 on 2", len(got), wc.dials)
		}
	})
	t.Run("1xx answers are skipped", func(t *testing.T) {
		url := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := readRequest(br); err == nil {
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		})
		res, err := postVia(t, newConnTransport(defaultProxyConfig()), url)
		if err != nil || res.StatusCode != http.StatusOK || readAll(t, res) != "ok" {
			t.Fatalf("got %v, %v", res, err)
		}
	})
	t.Run("oversized response headers are an error", func(t *testing.T) {
		url := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := readRequest(br); err == nil {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: ")
				chunk := strings.Repeat("x", 64<<10)
				for range 2 * maxResponseHeaderBytes / len(chunk) {
					if _, err := io.WriteString(c, chunk); err != nil {
						return
					}
				}
			}
		})
		if res, err := postVia(t, newConnTransport(defaultProxyConfig()), url); err == nil {
			res.Body.Close()
			t.Fatal("no error for response headers over the limit")
		}
	})
	t.Run("no answer within the first-byte timeout is a timeout", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		url := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			readRequest(br)
			<-release
		})
		cfg := defaultProxyConfig()
		cfg.FirstByteTimeout = 50 * time.Millisecond
		_, err := postVia(t, newConnTransport(cfg), url)
		if !isTimeout(err) || isDial(err) {
			t.Fatalf("error %v, want a timeout that is not a dial error", err)
		}
	})
	t.Run("a cancelled request stops waiting with the context's error", func(t *testing.T) {
		arrived := make(chan struct{})
		release := make(chan struct{})
		defer close(release)
		url := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			readRequest(br)
			close(arrived)
			<-release
		})
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(chatBody)), nil }
		go func() { <-arrived; cancel() }()
		_, err := newConnTransport(defaultProxyConfig()).RoundTrip(req)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want context.Canceled", err)
		}
	})
	t.Run("a refused connection is a dial error", func(t *testing.T) {
		_, err := postVia(t, newConnTransport(defaultProxyConfig()), closedURL(t))
		if !isDial(err) {
			t.Fatalf("error %v, want a dial error", err)
		}
	})
	t.Run("a body cut short is an error and the connection is not reused", func(t *testing.T) {
		url := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := readRequest(br); err == nil {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
			}
		})
		tr := newConnTransport(defaultProxyConfig())
		for range 2 {
			res, err := postVia(t, tr, url)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadAll(res.Body); err == nil {
				t.Fatal("no error for a body shorter than its Content-Length")
			}
			res.Body.Close()
		}
		if n := len(tr.idle); n != 0 {
			t.Errorf("%d idle connections kept after broken bodies", n)
		}
	})
	t.Run("upgrades go to the fallback transport", func(t *testing.T) {
		var seen bool
		tr := newConnTransport(defaultProxyConfig())
		tr.fallback = roundTripFunc(func(r *http.Request) (*http.Response, error) {
			seen = true
			return nil, errors.New("fallback")
		})
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/v1/realtime", nil)
		req.Header.Set("Upgrade", "websocket")
		tr.RoundTrip(req)
		if !seen {
			t.Error("an upgrade request did not reach the fallback transport")
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
