package balancer

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// sim is a fleet on a simulated clock for the four failures docs/ROUTING.md's rules prevent
// (crystallization, the WLC blind spot, users' requests as probes, flapping):
// every request holds a slot on its replica until it ends; every 3 s each
// replica is scraped (running = its requests up to slots, waiting = the
// rest) unless down(name, now) says its /metrics fails.
type sim struct {
	t      *testing.T
	b      *Balancer
	slots  int
	down   func(name string, now time.Time) bool
	active []simReq
	routed map[string]int // requests per replica since the last reset
	trans  []Transition
}

type simReq struct {
	res *Reservation
	end time.Time
}

func newSim(t *testing.T, replicas int) *sim {
	return &sim{t: t, b: newFleet(t, replicas, nil), slots: 16,
		down: func(string, time.Time) bool { return false }, routed: map[string]int{}}
}

// step advances the fleet to now: requests that ended are released, the
// scrape runs every 3 s, Tick every second.
func (s *sim) step(now time.Time) {
	kept := s.active[:0]
	for _, r := range s.active {
		if !now.Before(r.end) {
			s.trans = append(s.trans, s.b.Release(r.res, OutcomeOK, now)...)
			continue
		}
		kept = append(kept, r)
	}
	s.active = kept
	if now.Sub(t0)%(3*time.Second) == 0 {
		count := map[string]int{}
		for _, r := range s.active {
			count[r.res.Replica]++
		}
		for _, st := range s.b.Replicas(now) {
			if s.down(st.Name, now) {
				s.trans = append(s.trans, s.b.ObserveScrape(st.Name, Snapshot{}, errors.New("connection refused"), now)...)
				continue
			}
			n := count[st.Name]
			snap := Snapshot{Running: float64(min(n, s.slots)), Waiting: float64(max(0, n-s.slots))}
			s.trans = append(s.trans, s.b.ObserveScrape(st.Name, snap, nil, now)...)
		}
	}
	s.trans = append(s.trans, s.b.Tick(now)...)
}

// send routes one request lasting d.
func (s *sim) send(p *Profile, now time.Time, d time.Duration) *Reservation {
	res, err := s.b.Select(p, now)
	if err != nil {
		s.t.Fatalf("select at +%s: %v", now.Sub(t0), err)
	}
	s.active = append(s.active, simReq{res: res, end: now.Add(d)})
	s.routed[res.Replica]++
	return res
}

// Crystallization (docs/ROUTING.md, "Pin life cycle"): one shared system prompt (one prefix key) and
// 200 agent sessions for 60 simulated minutes must not end up on one replica.
func TestIncident1NoCrystallization(t *testing.T) {
	s := newSim(t, 4)
	rng := rand.New(rand.NewPCG(1, 2))
	next := make([]time.Time, 200)
	for i := range next {
		next[i] = t0.Add(time.Duration(rng.IntN(60)) * time.Second)
	}
	for sec := range 3600 {
		now := t0.Add(time.Duration(sec) * time.Second)
		s.step(now)
		for i := range next {
			if now.Before(next[i]) {
				continue
			}
			p := &Profile{SessionKey: fmt.Sprintf("session-%d", i), PrefixKey: "shared-system-prompt",
				PromptTokens: 400 + rng.IntN(400), OutputTokens: 200}
			s.send(p, now, time.Duration(5+rng.IntN(15))*time.Second)
			next[i] = now.Add(time.Duration(20+rng.IntN(60)) * time.Second)
		}
		if sec%300 == 299 { // a 5-minute window of traffic shares
			total := 0
			for _, n := range s.routed {
				total += n
			}
			for name, n := range s.routed {
				if share := float64(n) / float64(total); share > 0.40 {
					t.Errorf("minute %d: %s took %.0f%% of %d requests (%v): crystallized", sec/60+1, name, 100*share, total, s.routed)
				}
			}
			if len(s.routed) != 4 {
				t.Errorf("minute %d: traffic on %d replicas only: %v", sec/60+1, len(s.routed), s.routed)
			}
			for _, a := range s.b.Alerts(now) {
				t.Errorf("minute %d: alert %s: %s", sec/60+1, a.Name, a.Message)
			}
			s.routed = map[string]int{}
		}
	}
	perReplica := map[string]int{}
	for _, p := range pinsOf(s.b, t0.Add(time.Hour)) {
		if p.Kind == "session" {
			perReplica[p.Replica]++
		}
	}
	for name, n := range perReplica {
		if n > 200*40/100 {
			t.Errorf("%s holds %d of 200 session pins: %v", name, n, perReplica)
		}
	}
}

// The WLC blind spot (docs/ROUTING.md, "Effective load"): a burst between two scrapes (all replicas
// scraped idle) is spread by the reservations, never double-booked.
func TestIncident2BurstBetweenScrapes(t *testing.T) {
	tests := []struct {
		name    string
		burst   []Profile
		maxEach int
	}{
		{"8 new sessions", func() []Profile {
			var ps []Profile
			for i := range 8 {
				ps = append(ps, Profile{SessionKey: fmt.Sprint("s", i), PromptTokens: 2000})
			}
			return ps
		}(), 2},
		{"one agent's 5 parallel requests", func() []Profile {
			var ps []Profile
			for range 5 {
				ps = append(ps, Profile{SessionKey: "agent", PrefixKey: "project", PromptTokens: 2000})
			}
			return ps
		}(), 2},
		{"a 100K prefill then short requests", []Profile{
			{PromptTokens: 100_000}, {PromptTokens: 500}, {PromptTokens: 500}, {PromptTokens: 500},
			{PromptTokens: 500}, {PromptTokens: 500}, {PromptTokens: 500},
		}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newSim(t, 4)
			s.step(t0)
			now := t0.Add(time.Second) // between the scrapes at 0 s and 3 s
			var big string
			for i := range tc.burst {
				res := s.send(&tc.burst[i], now, time.Minute)
				if i == 0 {
					big = res.Replica
				} else if tc.burst[0].PromptTokens >= 100_000 && res.Replica == big {
					t.Errorf("request %d joined the 100K prefill on %s", i, big)
				}
			}
			for name, n := range s.routed {
				if n > tc.maxEach {
					t.Errorf("%s got %d of the burst, want <= %d: %v", name, n, tc.maxEach, s.routed)
				}
			}
		})
	}
}

// Health without users' requests as probes (docs/ROUTING.md, "Health"): an ejected replica receives no
// request until it has passed the way back (2 scrapes after the cooldown,
// PROBING, a clean 15 s), with steady traffic all along.
func TestIncident3NoUserRequestAsProbe(t *testing.T) {
	s := newSim(t, 3)
	s.down = func(name string, now time.Time) bool {
		at := now.Sub(t0)
		return name == "a" && at >= 10*time.Second && at < 70*time.Second
	}
	var ejectedAt, probingAt, liveAt time.Time
	afterLive := 0
	for sec := range 180 {
		now := t0.Add(time.Duration(sec) * time.Second)
		s.step(now)
		for _, tr := range s.trans {
			if tr.Replica != "a" {
				continue
			}
			switch tr.To.String() {
			case "EJECTED":
				ejectedAt = tr.At
			case "PROBING":
				probingAt = tr.At
			case "LIVE":
				liveAt = tr.At
			}
		}
		s.trans = s.trans[:0]
		for range 2 {
			res := s.send(&Profile{PromptTokens: 1000}, now, 2*time.Second)
			if res.Replica == "a" && !ejectedAt.IsZero() && (liveAt.IsZero() || liveAt.Before(ejectedAt)) {
				t.Fatalf("+%s: a user request went to a, ejected at +%s and not LIVE again", now.Sub(t0), ejectedAt.Sub(t0))
			}
			if res.Replica == "a" && !liveAt.IsZero() && liveAt.After(ejectedAt) {
				afterLive++
			}
		}
	}
	if ejectedAt.IsZero() || probingAt.IsZero() || liveAt.IsZero() {
		t.Fatalf("way back incomplete: ejected %v probing %v live %v", ejectedAt, probingAt, liveAt)
	}
	// Eject at the first failed scrape (12 s); scrapes resume at 72 s and
	// 75 s (the 30 s cooldown is long over): PROBING; LIVE 15 s later.
	if got := []time.Duration{ejectedAt.Sub(t0), probingAt.Sub(t0), liveAt.Sub(t0)}; got[0] != 12*time.Second ||
		got[1] != 75*time.Second || got[2] != 90*time.Second {
		t.Fatalf("ejected/probing/live at %v, want [12s 75s 1m30s]", got)
	}
	if afterLive == 0 {
		t.Fatalf("a got no traffic after it came back")
	}
}

// Flapping (docs/ROUTING.md, "Health"): a replica whose /metrics alternates 15 s down / 15 s
// up gets the growing cooldowns 30/60/120/240/300/300, never becomes LIVE
// again, and never gets a pin.
func TestIncident4Flapping(t *testing.T) {
	s := newSim(t, 4)
	s.down = func(name string, now time.Time) bool {
		return name == "a" && (now.Sub(t0)/(15*time.Second))%2 == 0
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var cooldowns []time.Duration
	for sec := range 30 * 60 {
		now := t0.Add(time.Duration(sec) * time.Second)
		s.step(now)
		for _, tr := range s.trans {
			if tr.Replica != "a" {
				continue
			}
			if tr.To.String() == "EJECTED" {
				cooldowns = append(cooldowns, tr.Cooldown)
			}
			if tr.To.String() == "LIVE" {
				t.Fatalf("+%s: the flapping replica became LIVE", now.Sub(t0))
			}
		}
		s.trans = s.trans[:0]
		for range 3 {
			p := &Profile{SessionKey: fmt.Sprint("s", rng.IntN(50)), PrefixKey: fmt.Sprint("p", rng.IntN(5)), PromptTokens: 4000}
			s.send(p, now, time.Duration(1+rng.IntN(5))*time.Second)
		}
		if sec%10 == 0 {
			for _, p := range pinsOf(s.b, now) {
				if p.Replica == "a" {
					t.Fatalf("+%s: %s pin %s on the flapping replica", now.Sub(t0), p.Kind, p.Key)
				}
			}
		}
	}
	want := []time.Duration{30, 60, 120, 240, 300, 300}
	if len(cooldowns) < len(want) {
		t.Fatalf("cooldowns %v, want at least %v (seconds)", cooldowns, want)
	}
	for i, w := range want {
		if cooldowns[i] != w*time.Second {
			t.Fatalf("cooldowns %v, want %v (seconds)", cooldowns, want)
		}
	}
	if !firing(s.b, t0.Add(30*time.Minute), "flapping") {
		t.Fatalf("no flapping alert")
	}
}
