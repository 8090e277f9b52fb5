package admin

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/llmlb/llmlb/internal/pins"
	"github.com/llmlb/llmlb/internal/policy"
)

// Paging of GET /admin/pins (docs/SECURITY.md: `?limit=0` over 1M pins was a
// 443 MB answer built under the routing lock).
const (
	defaultPinsPage = 1000
	// MaxPinsPage is the most pins one answer of GET /admin/pins holds;
	// larger (and 0) limits are clamped to it, the rest comes by cursor.
	MaxPinsPage = 10_000
	// maxPageCalls bounds the routing-lock acquisitions of one answer: each
	// copies a bounded slice of the table, and the lock is released between
	// them and while the answer is encoded.
	maxPageCalls = 16
	// pinsPageSlack is how many expired or skipped pins one page may visit
	// beyond its limit, so that the core's lock is held for a bounded walk
	// whatever the table's size.
	pinsPageSlack = 4096
	maxCursorLen  = 512
)

// pins serves GET /admin/pins?limit=N&cursor=C: a JSON array of at most
// MaxPinsPage pins. When more follow, the answer carries the opaque cursor
// of the next page in X-LLMLB-Next-Cursor and a Link rel="next" header.
// Pins are session ids, so the token is required when one is configured.
func (h *Handler) pins(w http.ResponseWriter, r *http.Request) {
	if acc := h.acc.Load(); acc.token != "" && !acc.authorized(r) {
		unauthorized(w, "GET /admin/pins (it lists session ids) and admin mutations")
		return
	}
	q := r.URL.Query()
	limit := h.opts.PinsLimit
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be an integer in 0..%d (0 or more = the largest page; follow X-LLMLB-Next-Cursor for the rest)", MaxPinsPage))
			return
		}
		if n == 0 || n > MaxPinsPage {
			n = MaxPinsPage
		}
		limit = n
	}
	cur, err := decodeCursor(q.Get("cursor"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "cursor: "+err.Error()+" (pass X-LLMLB-Next-Cursor of the previous answer as it is)")
		return
	}
	now := h.now()
	out := make([]policy.PinStatus, 0, min(limit, 1024))
	done := false
	for calls := 0; calls < maxPageCalls && len(out) < limit && !done; calls++ {
		var page []policy.PinStatus
		done = true // a policy without pins has none to list
		h.opts.Balancer.Inspect(func(p policy.Policy) {
			if t, ok := p.(policy.PinTable); ok {
				page, cur, done = t.PinPage(now, cur, limit-len(out), pinsPageSlack)
			}
		})
		out = append(out, page...)
	}
	if !done {
		c := encodeCursor(cur)
		w.Header().Set("X-LLMLB-Next-Cursor", c)
		w.Header().Set("Link", fmt.Sprintf(`</admin/pins?limit=%d&cursor=%s>; rel="next"`, limit, url.QueryEscape(c)))
	}
	writeJSON(w, http.StatusOK, out)
}

// encodeCursor renders a cursor as URL-safe base64 of kind, segment, last
// use and key.
func encodeCursor(c pins.Cursor) string {
	b := make([]byte, 10, 10+len(c.Key))
	b[0] = byte(c.Kind)
	if c.Reused {
		b[1] = 1
	}
	binary.BigEndian.PutUint64(b[2:], uint64(c.LastUse))
	b = append(b, c.Key...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(s string) (pins.Cursor, error) {
	if s == "" {
		return pins.Cursor{}, nil
	}
	if len(s) > maxCursorLen {
		return pins.Cursor{}, errors.New("too long")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 10 || b[1] > 1 {
		return pins.Cursor{}, errors.New("not a cursor of this server")
	}
	return pins.Cursor{Kind: pins.Kind(b[0]), Reused: b[1] == 1,
		LastUse: int64(binary.BigEndian.Uint64(b[2:10])), Key: string(b[10:])}, nil
}
