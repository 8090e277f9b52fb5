package policy

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func cands(inFlight ...int) []Candidate {
	cs := make([]Candidate, len(inFlight))
	for i, f := range inFlight {
		cs[i] = Candidate{Name: fmt.Sprintf("r%d", i), Live: true, InFlight: f}
	}
	return cs
}

func TestNew(t *testing.T) {
	for _, name := range Names() {
		p, err := New(name)
		if err != nil {
			t.Fatalf("New(%q): %v", name, err)
		}
		if p.Name() != name {
			t.Errorf("New(%q).Name() = %q", name, p.Name())
		}
	}
	for _, bad := range []string{"", "LLMLB", "RR", "random"} {
		_, err := New(bad)
		if err == nil || !strings.HasPrefix(err.Error(), "policy: unknown policy") {
			t.Errorf("New(%q) error = %v, want unknown policy", bad, err)
		}
	}
}

func must(p Policy, err error) Policy {
	if err != nil {
		panic(err)
	}
	return p
}

func TestRoundRobin(t *testing.T) {
	p := NewRoundRobin()
	steps := []struct {
		name  string
		cands []Candidate
		want  int
	}{
		{"first", cands(0, 0, 0), 0},
		{"second", cands(0, 0, 0), 1},
		{"ignores load", cands(0, 99, 0), 2},
		{"wraps", cands(0, 0, 0), 0},
		{"fewer candidates", cands(0, 0), 0},
		{"rotation continues", cands(0, 0), 1},
	}
	for _, s := range steps {
		got := p.Choose(&Request{}, s.cands, t0)
		if got.Index != s.want || got.Reason != ReasonLoad {
			t.Errorf("%s: got %+v, want index %d reason load", s.name, got, s.want)
		}
	}
}

func TestLeastRequest(t *testing.T) {
	p := NewLeastRequest()
	steps := []struct {
		name  string
		cands []Candidate
		want  int
	}{
		{"single minimum", cands(3, 1, 2), 1},
		{"minimum last", cands(3, 2, 0), 2},
		{"tie rotates: first", cands(1, 0, 0), 1},
		{"tie rotates: second", cands(1, 0, 0), 2},
		{"tie rotates: wraps", cands(1, 0, 0), 1},
		{"all equal", cands(5, 5, 5, 5), 1}, // the counter advances on every call
		{"one candidate", cands(7), 0},
	}
	for _, s := range steps {
		got := p.Choose(&Request{}, s.cands, t0)
		if got.Index != s.want || got.Reason != ReasonLoad {
			t.Errorf("%s: got %+v, want index %d reason load", s.name, got, s.want)
		}
	}
}

func TestLeastRequestSpreadsIdleFleet(t *testing.T) {
	p := NewLeastRequest()
	cs := cands(0, 0, 0, 0)
	for range 64 {
		c := p.Choose(&Request{}, cs, t0)
		cs[c.Index].InFlight++
	}
	for _, c := range cs {
		if c.InFlight != 16 {
			t.Fatalf("in-flight after 64 picks: %+v, want 16 each", cs)
		}
	}
}

func TestSticky(t *testing.T) {
	p := NewSticky()
	four := cands(0, 0, 0, 0)
	home := func(r *Request, cs []Candidate) string { return cs[p.Choose(r, cs, t0).Index].Name }
	sess := &Request{SessionKey: "session-a", PrefixKey: "p1"}

	first := home(sess, four)
	tests := []struct {
		name   string
		req    *Request
		cands  []Candidate
		want   string
		reason string
	}{
		{"same session same replica", sess, four, first, ReasonAffinity},
		{"ignores load", sess, func() []Candidate { c := cands(0, 0, 0, 0); c[indexOf(c, first)].InFlight = 1000; return c }(), first, ReasonAffinity},
		{"candidate order does not matter", sess, reversed(four), first, ReasonAffinity},
		{"another replica leaving does not move the key", sess, without(four, other(four, first)), first, ReasonAffinity},
		{"prefix key when no session", &Request{PrefixKey: "p1"}, four, home(&Request{SessionKey: "p1"}, four), ReasonAffinity},
	}
	for _, tt := range tests {
		c := p.Choose(tt.req, tt.cands, t0)
		if got := tt.cands[c.Index].Name; got != tt.want || c.Reason != tt.reason {
			t.Errorf("%s: got %s/%s, want %s/%s", tt.name, got, c.Reason, tt.want, tt.reason)
		}
	}

	// Home replica gone: the key moves, and only to a remaining candidate.
	rest := without(four, first)
	if got := home(sess, rest); got == first {
		t.Errorf("home replica removed, still routed to %s", got)
	}

	// No key at all: rotation, reason load.
	var got []int
	for range 4 {
		c := p.Choose(&Request{}, four, t0)
		if c.Reason != ReasonLoad {
			t.Errorf("keyless reason = %q, want load", c.Reason)
		}
		got = append(got, c.Index)
	}
	if fmt.Sprint(got) != "[0 1 2 3]" {
		t.Errorf("keyless rotation = %v, want [0 1 2 3]", got)
	}
}

func TestStickySpreadsKeys(t *testing.T) {
	p := NewSticky()
	cs := cands(0, 0, 0, 0)
	counts := make([]int, len(cs))
	for i := range 4000 {
		counts[p.Choose(&Request{SessionKey: fmt.Sprintf("s-%d", i)}, cs, t0).Index]++
	}
	for i, n := range counts {
		if n < 800 || n > 1200 {
			t.Errorf("replica %d got %d of 4000 keys, want about 1000 (%v)", i, n, counts)
		}
	}
}

func reversed(cs []Candidate) []Candidate {
	out := make([]Candidate, len(cs))
	for i, c := range cs {
		out[len(cs)-1-i] = c
	}
	return out
}

func without(cs []Candidate, name string) []Candidate {
	var out []Candidate
	for _, c := range cs {
		if c.Name != name {
			out = append(out, c)
		}
	}
	return out
}

func other(cs []Candidate, name string) string {
	for _, c := range cs {
		if c.Name != name {
			return c.Name
		}
	}
	return ""
}
