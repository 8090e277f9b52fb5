package proxy

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A stream holds what it references for as long as it lasts: its request
// body, an agent's prompt of tens or hundreds of KiB, must not be among
// it once the replica's answer is relayed. Eight streams with 4 MiB
// bodies held open after their first chunk keep far less than one body
// alive (each body's buffer is 8 MiB: 4 MiB and the byte that shows EOF,
// rounded up to the pool's class).
func TestHeldStreamLetsGoOfItsBody(t *testing.T) {
	const streams, size = 8, 4 << 20
	hold := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(up.Close)
	t.Cleanup(func() { close(hold) })
	cfg := defaultProxyConfig()
	cfg.MaxBodyBytes = 2 * size
	f := newFixture(t, cfg, replica{name: "a", url: up.URL})
	front := f.front(t)

	body := []byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"` + strings.Repeat("x", size) + `"}]}`)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	client := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(client.CloseIdleConnections)
	before := liveHeap()
	for range streams {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, front.URL+"/v1/chat/completions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { res.Body.Close() })
		if res.StatusCode != http.StatusOK {
			t.Fatalf("status %d", res.StatusCode)
		}
		if _, err := bufio.NewReader(res.Body).ReadSlice('\n'); err != nil {
			t.Fatalf("first chunk: %v", err)
		}
	}
	// The proxy lets go of a body on its own goroutines, after the
	// transport reports the request written; on a busy machine the last
	// stream's first chunk can reach the client before that: wait for it
	// (each look takes two collections).
	var grew int64
	for range 50 {
		if grew = int64(liveHeap()) - int64(before); grew <= size {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("%d held streams keep %d MiB alive, want less than one body (%d MiB)", streams, grew>>20, size>>20)
}

// liveHeap is the bytes of live heap objects after two collections (the
// second empties sync.Pool's victim cache).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
