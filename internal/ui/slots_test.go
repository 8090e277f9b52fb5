package ui

import (
	"bufio"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// Sixteen idle /admin/events subscribers locked the operator's own /ui out
// (503). A subscriber holding the token or connecting from loopback always
// gets a slot: the oldest anonymous subscriber is dropped for it; an
// anonymous stream ends after MaxStreamAge (the page's EventSource
// reconnects).
func TestPrivilegedSubscriberGetsASlot(t *testing.T) {
	d, _, clk := newTestDashboard(t, Options{Token: "secret", MaxSubscribers: 2})
	// The test server is on loopback: say who is local with a header.
	d.local = func(r *http.Request) bool { return r.Header.Get("X-Test-Local") != "" }
	srv := serve(t, d)
	open := func(hdr map[string]string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/admin/events", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		return http.DefaultTransport.RoundTrip(req)
	}
	var anon []*stream
	for range 2 {
		res, err := open(nil)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("anonymous subscriber: %v %v", res, err)
		}
		t.Cleanup(func() { res.Body.Close() })
		s := &stream{resp: res, r: newReader(res)}
		s.next(t)
		anon = append(anon, s)
	}
	if res, err := open(nil); err != nil || res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("a third anonymous subscriber: %v %v, want 503", res.StatusCode, err)
	} else {
		res.Body.Close()
	}
	for _, tc := range []struct {
		name string
		hdr  map[string]string
	}{
		{"the token holder", map[string]string{"Authorization": "Bearer secret"}},
		{"a loopback client", map[string]string{"X-Test-Local": "1"}},
	} {
		res, err := open(tc.hdr)
		if err != nil || res.StatusCode != http.StatusOK {
			t.Fatalf("%s with every slot taken: %v %v, want 200", tc.name, res, err)
		}
		t.Cleanup(func() { res.Body.Close() })
		(&stream{resp: res, r: newReader(res)}).next(t)
	}
	// Both anonymous streams were dropped for them, the oldest first.
	for i, s := range anon {
		if !s.ends(t) {
			t.Errorf("anonymous stream %d still open", i)
		}
	}

	// An anonymous stream ends after MaxStreamAge; a privileged one does not.
	d2, _, _ := newTestDashboard(t, Options{MaxSubscribers: 4, MaxStreamAge: time.Minute})
	var nanos atomic.Int64
	nanos.Store(t0.UnixNano())
	clk2 := func() time.Time { return time.Unix(0, nanos.Load()) }
	d2.now = clk2
	d2.local = func(r *http.Request) bool { return r.Header.Get("X-Test-Local") != "" }
	srv2 := serve(t, d2)
	req, _ := http.NewRequest(http.MethodGet, srv2.URL+"/admin/events", nil)
	res, err := http.DefaultTransport.RoundTrip(req)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("anonymous subscriber: %v", err)
	}
	t.Cleanup(func() { res.Body.Close() })
	s := &stream{resp: res, r: newReader(res)}
	s.next(t)
	nanos.Add(int64(2 * time.Minute))
	d2.publish(clk2())
	if !s.ends(t) {
		t.Error("an anonymous stream older than MaxStreamAge is still open")
	}
	_ = clk
}

func newReader(res *http.Response) *bufio.Reader { return bufio.NewReader(res.Body) }

// ends reports whether the stream ends (EOF or a broken read). The 10 s
// bound only guards against a hang of the code under test.
func (s *stream) ends(t *testing.T) bool {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(io.Discard, s.r)
	}()
	select {
	case <-done:
		return true
	case <-time.After(10 * time.Second):
		s.resp.Body.Close()
		<-done
		return false
	}
}
