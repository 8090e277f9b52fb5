package ui

import (
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
)

// decisionRecord is one routing decision as recorded on the hot path; the
// text explanation is written only when a snapshot is built.
type decisionRecord struct {
	Seq          uint64
	At           time.Time
	Replica      string
	Reason       balancer.Reason
	Attempt      int
	Model        string
	Session      string
	Prefix       bool
	PromptTokens int
	Explanation  balancer.Explanation
}

// decisionRing keeps the latest decisions in a fixed array: adding one is a
// copy, never an allocation. It is guarded by the dashboard's lock.
type decisionRing struct {
	buf []decisionRecord
	seq uint64 // sequence number of the latest decision (0: none yet)
}

func newDecisionRing(n int) decisionRing { return decisionRing{buf: make([]decisionRecord, n)} }

func (r *decisionRing) add(d decisionRecord) {
	r.seq++
	d.Seq = r.seq
	r.buf[r.seq%uint64(len(r.buf))] = d
}

// len returns how many decisions the ring holds.
func (r *decisionRing) len() int { return int(min(r.seq, uint64(len(r.buf)))) }

// last returns up to n of the latest decisions, newest first.
func (r *decisionRing) last(n int) []decisionRecord {
	n = min(n, r.len())
	out := make([]decisionRecord, n)
	for i := range n {
		out[i] = r.buf[(r.seq-uint64(i))%uint64(len(r.buf))]
	}
	return out
}

// each calls f for every decision held, newest first.
func (r *decisionRing) each(f func(*decisionRecord)) {
	for i := range r.len() {
		f(&r.buf[(r.seq-uint64(i))%uint64(len(r.buf))])
	}
}
