package ui

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/llmlb/llmlb/internal/openai"
)

// writeTimeout bounds one write to an event stream: a subscriber that does
// not take a snapshot within it is dropped.
const writeTimeout = 10 * time.Second

// published is one snapshot, encoded once as SSE frames; next is closed
// when a newer one replaces it, which wakes every subscriber at once.
type published struct {
	at             time.Time
	full, redacted []byte
	next           chan struct{}
}

// Run builds and publishes a snapshot every Interval while at least one
// event stream is open, until ctx is cancelled. Its owner starts it.
func (d *Dashboard) Run(ctx context.Context) {
	t := time.NewTicker(d.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if d.subscribers.Load() > 0 {
				d.publish(d.now())
			}
		}
	}
}

// Close ends every event stream and refuses new ones; the server calls it
// when the admin listener shuts down (a stream is never idle, so
// http.Server.Shutdown would otherwise wait for it until its deadline).
func (d *Dashboard) Close() { d.closeOnce.Do(func() { close(d.closed) }) }

// publish builds, encodes and publishes one snapshot at now.
func (d *Dashboard) publish(now time.Time) *published {
	d.buildMu.Lock()
	defer d.buildMu.Unlock()
	s := d.Snapshot(now)
	p := &published{at: now, next: make(chan struct{})}
	p.full = frame(s)
	if s.TokenConfigured {
		p.redacted = frame(s.redacted())
	}
	d.pub.Lock()
	old := d.latest
	d.latest = p
	d.pub.Unlock()
	if old != nil {
		close(old.next)
	}
	return p
}

// current returns the latest snapshot, building one when there is none or
// it is older than an interval (the first subscriber after a quiet time).
func (d *Dashboard) current() *published {
	d.pub.Lock()
	p := d.latest
	d.pub.Unlock()
	if p != nil && d.now().Sub(p.at) < d.opts.Interval {
		return p
	}
	return d.publish(d.now())
}

// frame encodes a snapshot as one SSE event.
func frame(s *Snapshot) []byte {
	body, err := json.Marshal(s)
	if err != nil { // plain data: cannot happen
		body = []byte(`{}`)
	}
	var b bytes.Buffer
	b.Grow(len(body) + 32)
	b.WriteString("event: snapshot\ndata: ")
	b.Write(body)
	b.WriteString("\n\n")
	return b.Bytes()
}

// authorized reports whether r presents the admin token (always true when
// none is configured).
func (d *Dashboard) authorized(r *http.Request) bool {
	a := d.access.Load()
	if a.token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(got))
	return ok && subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1
}

// serveEvents streams snapshots as server-sent events (GET /admin/events).
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	select {
	case <-d.closed:
		writeError(w, http.StatusServiceUnavailable, "shutting down")
		return
	default:
	}
	full := d.authorized(r)
	priv := d.isLocal(r) || (full && d.access.Load().token != "")
	sub := d.join(priv)
	if sub == nil {
		w.Header().Set("Retry-After", "10")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("too many event streams (at most %d)", d.opts.MaxSubscribers))
		return
	}
	defer d.leave(sub)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send([]byte("retry: 2000\n\n")) {
		return
	}
	p := d.current()
	for {
		b := p.full
		if !full && p.redacted != nil {
			b = p.redacted
		}
		if !send(b) {
			d.log.Debug("ui: event stream dropped", slog.String("remote", r.RemoteAddr))
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-d.closed:
			return
		case <-sub.kick:
			d.log.Debug("ui: anonymous event stream dropped for a privileged one", slog.String("remote", r.RemoteAddr))
			return
		case <-p.next:
		}
		if !priv && d.now().Sub(sub.start) >= d.opts.MaxStreamAge {
			return // the page's EventSource reconnects
		}
		d.pub.Lock()
		p = d.latest
		d.pub.Unlock()
	}
}

// subscriber is one open event stream.
type subscriber struct {
	priv  bool // holds the token or connects from loopback
	start time.Time
	kick  chan struct{} // closed to drop it for a privileged subscriber
}

// join takes a slot for a new stream, or returns nil when none is left. A
// privileged subscriber takes the oldest anonymous one's slot when all are
// taken; privileged subscribers alone may hold up to twice MaxSubscribers.
func (d *Dashboard) join(priv bool) *subscriber {
	s := &subscriber{priv: priv, start: d.now(), kick: make(chan struct{})}
	d.subsMu.Lock()
	defer d.subsMu.Unlock()
	if len(d.subs) >= d.opts.MaxSubscribers {
		if !priv {
			return nil
		}
		i := slices.IndexFunc(d.subs, func(o *subscriber) bool { return !o.priv })
		switch {
		case i >= 0:
			close(d.subs[i].kick)
			d.subs = slices.Delete(d.subs, i, i+1)
			d.subscribers.Add(-1)
		case len(d.subs) >= 2*d.opts.MaxSubscribers:
			return nil
		}
	}
	d.subs = append(d.subs, s)
	d.subscribers.Add(1)
	return s
}

// leave frees s's slot (if a privileged subscriber has not taken it).
func (d *Dashboard) leave(s *subscriber) {
	d.subsMu.Lock()
	defer d.subsMu.Unlock()
	if i := slices.Index(d.subs, s); i >= 0 {
		d.subs = slices.Delete(d.subs, i, i+1)
		d.subscribers.Add(-1)
	}
}

// isLocal reports whether r comes from a loopback address.
func (d *Dashboard) isLocal(r *http.Request) bool {
	if d.local != nil {
		return d.local(r)
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// writeError answers in the OpenAI error shape the admin API uses. The
// map encodes its keys sorted (code, message, type), as the dashboard has
// always answered, unlike openai.ErrorBody's order.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{
		"message": msg, "type": openai.TypeServer, "code": openai.StatusCode(status)}})
}
