package policy

import (
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// Sticky is hash-based session affinity with no load awareness (docs/POLICIES.md):
// rendezvous (highest random weight) hashing of the session key over the
// candidates' names, so a key keeps its replica while that replica stays a
// candidate, and only the keys of a replica that leaves are moved. A request
// without a session key is hashed by its prefix key; one with neither is
// rotated.
type Sticky struct {
	Base
	next uint64
}

// NewSticky returns a sticky policy.
func NewSticky() *Sticky { return &Sticky{} }

// Name returns "sticky".
func (p *Sticky) Name() string { return NameSticky }

// Choose returns the candidate with the highest hash weight for the request's
// key, or the next in rotation when the request has no key.
func (p *Sticky) Choose(r *Request, cands []Candidate, _ time.Time) Choice {
	key, detail := "", ""
	switch {
	case r != nil && r.SessionKey != "":
		key, detail = r.SessionKey, "session hash"
	case r != nil && r.PrefixKey != "":
		key, detail = r.PrefixKey, "prefix hash"
	default:
		i := int(p.next % uint64(len(cands)))
		p.next++
		return Choice{Index: i, Reason: ReasonLoad, Detail: "no key: rotation", Rule: "no session key: rotation"}
	}
	return Choice{Index: rendezvous(key, cands), Reason: ReasonAffinity, Detail: detail, Rule: "session hash"}
}

// rendezvous returns the index of the candidate with the highest weight
// hash(key, name); ties (practically impossible) go to the first.
func rendezvous(key string, cands []Candidate) int {
	base := fnvString(fnvOffset, key)
	base = fnvByte(base, 0)
	best, bestW := 0, uint64(0)
	for i, c := range cands {
		w := tokenize.Mix64(fnvString(base, c.Name))
		if i == 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return best
}

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

func fnvByte(h uint64, b byte) uint64 {
	h ^= uint64(b)
	return h * fnvPrime
}
