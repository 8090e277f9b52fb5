package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/llmlb/llmlb/internal/openai"
)

// Loop detection. Every request llmlb forwards carries its instance id in
// HeaderVia (appended to the ids already there: llmlb in front of llmlb is a
// legitimate chain). A request arriving with this instance's own id has come
// back to it, through a replica URL that is llmlb's own listener or a chain
// that ends here: it is answered 508 loop_detected with HeaderLoop naming
// the instance, and the instance that sent it away (the same one) sees its
// own id in the answer's HeaderLoop, ejects that replica and tries another.
const (
	// HeaderVia lists the llmlb instances a request went through.
	HeaderVia = "X-LLMLB-Via"
	// HeaderLoop, on a 508 answer, names the instance that saw its own
	// mark come back.
	HeaderLoop = "X-LLMLB-Loop"
)

var (
	viaKey  = http.CanonicalHeaderKey(HeaderVia)
	loopKey = http.CanonicalHeaderKey(HeaderLoop)
)

// errLoop: the replica sent the request back to this llmlb.
var errLoop = errors.New("proxy: request loop: the replica forwarded the request back to this llmlb")

// newInstanceID returns 16 random hex digits: unique per process, so two
// llmlbs in a chain never take each other's mark for their own.
func newInstanceID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// InstanceID is the mark this proxy puts on the requests it forwards.
func (p *Proxy) InstanceID() string { return p.id }

// looped reports whether r carries this instance's mark.
func (p *Proxy) looped(r *http.Request) bool {
	for _, v := range r.Header[viaKey] {
		for id := range strings.SplitSeq(v, ",") {
			if strings.TrimSpace(id) == p.id {
				return true
			}
		}
	}
	return false
}

// refuseLoop answers a request that came back to this instance.
func (p *Proxy) refuseLoop(w http.ResponseWriter) {
	w.Header().Set(HeaderLoop, p.id)
	p.metrics.Request("", "", http.StatusLoopDetected)
	openai.WriteError(w, http.StatusLoopDetected, openai.TypeServer, openai.CodeLoopDetected,
		"request loop: this request already went through this llmlb (a replica URL points back at it)")
}

// isOwnLoop reports whether res is this instance's refusal of a request it
// sent itself.
func (p *Proxy) isOwnLoop(res *http.Response) bool {
	return res.StatusCode == http.StatusLoopDetected && res.Header.Get(HeaderLoop) == p.id
}

// noteLoop logs a looping replica once per replica name.
func (p *Proxy) noteLoop(replica, url string) {
	if _, seen := p.loops.LoadOrStore(replica, true); seen {
		return
	}
	p.log.Error("proxy: request loop: the replica forwards to this llmlb itself; ejected",
		slog.String("replica", replica), slog.String("url", url))
}

// answerLoop answers the client whose request only found looping replicas.
func (p *Proxy) answerLoop(w http.ResponseWriter, replica string) {
	msg := fmt.Sprintf("request loop: replica %s forwards to this llmlb itself", replica)
	p.answer(w, http.StatusLoopDetected, openai.TypeServer, openai.CodeLoopDetected, msg)
}
