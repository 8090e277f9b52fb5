package hostile

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// Dial opens a TCP connection to addr (host:port) closed when the test
// ends.
func Dial(t testing.TB, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// SlowBody sends a POST to path announcing a body of contentLength bytes,
// sends only first of it and keeps the connection open: the client that
// makes a server reserve memory for a body that never comes.
func SlowBody(t testing.TB, addr, path string, contentLength int64, first string) net.Conn {
	t.Helper()
	c := Dial(t, addr)
	_, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, addr, contentLength, first)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// IdleConns opens n connections that send nothing.
func IdleConns(t testing.TB, addr string, n int) []net.Conn {
	t.Helper()
	out := make([]net.Conn, n)
	for i := range out {
		out[i] = Dial(t, addr)
	}
	return out
}

// Raw sends method and target exactly as given (no cleaning of "..",
// no re-encoding) with body, and returns the status and the body of the
// answer. The connection is closed after it.
func Raw(t testing.TB, addr, method, target, body string) (int, string) {
	t.Helper()
	c := Dial(t, addr)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, err := fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		method, target, addr, len(body), body)
	if err != nil {
		t.Fatal(err)
	}
	res, err := readResponse(c, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}
