package workload

import (
	"slices"
	"testing"
	"time"
)

func TestFloodTenantSendsTenTimesEachPoliteRate(t *testing.T) {
	w, err := New("flood", Params{Seed: 3, Duration: 20 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	reqs := drive(t, w, fixed(time.Second))
	for _, r := range reqs {
		count[r.Tenant]++
	}
	if len(count) != politeTenants+1 {
		t.Fatalf("tenants %v, want %d polite and the flooder", count, politeTenants)
	}
	total := floodLoad * oneshotSpec.defaultRate(DefaultReplicas) * 20 * 60
	if !within(float64(len(reqs)), total, 0.05) {
		t.Errorf("%d requests, want ~%.0f", len(reqs), total)
	}
	for i := range politeTenants {
		n := count[politeName(i)]
		if !within(float64(count[FloodTenant]), floodFactor*float64(n), 0.15) {
			t.Errorf("flooder sent %d, %s %d: want 10x", count[FloodTenant], politeName(i), n)
		}
	}
}

// TestFloodPoliteIsFloodWithoutTheFlooder: flood-polite is exactly the
// polite tenants' requests of flood, so "alone" compares like with like.
func TestFloodPoliteIsFloodWithoutTheFlooder(t *testing.T) {
	p := Params{Seed: 4, Duration: 10 * time.Minute}
	all, err := New("flood", p)
	if err != nil {
		t.Fatal(err)
	}
	alone, err := New("flood-polite", p)
	if err != nil {
		t.Fatal(err)
	}
	var polite []*Request
	for _, r := range drive(t, all, fixed(time.Second)) {
		if r.Tenant != FloodTenant {
			polite = append(polite, r)
		}
	}
	got := drive(t, alone, fixed(time.Second))
	if len(got) != len(polite) || len(got) == 0 {
		t.Fatalf("flood-polite has %d requests, flood's polite tenants %d", len(got), len(polite))
	}
	ids := map[uint64]bool{}
	for i, r := range got {
		q := polite[i]
		if r.ID != q.ID || r.At != q.At || r.Tenant != q.Tenant || r.Output != q.Output ||
			r.Profile.PrefixKey != q.Profile.PrefixKey || !slices.Equal(r.Prompt.Blocks, q.Prompt.Blocks) {
			t.Fatalf("request %d differs: %+v against %+v", i, r, q)
		}
		if ids[r.ID] {
			t.Fatalf("id %d given twice", r.ID)
		}
		ids[r.ID] = true
	}
}

func TestWithPrioritiesDrawsSharesAndKeepsSessionsTogether(t *testing.T) {
	for _, name := range []string{"oneshot", "agentic"} {
		t.Run(name, func(t *testing.T) {
			inner, err := New(name, Params{Seed: 5, Duration: 30 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			w, err := WithPriorities(inner, 5, 0.2, 0.3)
			if err != nil {
				t.Fatal(err)
			}
			count := map[int]int{}
			class := map[string]int{}
			units := map[int]int{} // sessions (or requests without one) per class
			reqs := drive(t, w, fixed(2*time.Second))
			for _, r := range reqs {
				count[r.Priority]++
				if r.Session == "" {
					units[r.Priority]++
					continue
				}
				if c, ok := class[r.Session]; ok && c != r.Priority {
					t.Fatalf("session %s has priorities %d and %d", r.Session, c, r.Priority)
				} else if !ok {
					units[r.Priority]++
				}
				class[r.Session] = r.Priority
			}
			n := float64(units[PriorityHigh] + units[PriorityShed] + units[PriorityBasic])
			tol := 0.05
			if name == "agentic" {
				tol = 0.12 // a few hundred sessions
			}
			for _, c := range []struct {
				prio  int
				share float64
			}{{PriorityHigh, 0.2}, {PriorityShed, 0.3}, {PriorityBasic, 0.5}} {
				if got := float64(units[c.prio]) / n; got < c.share-tol || got > c.share+tol {
					t.Errorf("priority %d: share %.3f of %v, want %.2f", c.prio, got, n, c.share)
				}
			}
			if len(count) != 3 {
				t.Errorf("classes %v", count)
			}
		})
	}
	if _, err := WithPriorities(nil, 1, 0.5, 0.6); err == nil {
		t.Error("shares summing past 1 accepted")
	}
}

// TestSpeedMultipliesTheRate: Speed 2 doubles a workload's arrivals,
// whether its rate is the default or given (open loop: a closed-loop
// workload scales its session arrivals, whose request counts vary more).
func TestSpeedMultipliesTheRate(t *testing.T) {
	count := func(name string, p Params) int {
		w, err := New(name, p)
		if err != nil {
			t.Fatal(err)
		}
		return len(drive(t, w, fixed(time.Second)))
	}
	for _, name := range []string{"oneshot", "longshort", "flood"} {
		p := Params{Seed: 2, Duration: 10 * time.Minute}
		one := count(name, p)
		p.Speed = 2
		if two := count(name, p); !within(float64(two), 2*float64(one), 0.08) {
			t.Errorf("%s: %d requests at speed 2, %d at 1", name, two, one)
		}
		p.Rate, p.Speed = 3, 1
		p3 := count(name, p)
		p.Speed = 2
		if p6 := count(name, p); !within(float64(p6), 2*float64(p3), 0.08) {
			t.Errorf("%s: %d requests at rate 3 speed 2, %d at speed 1", name, p6, p3)
		}
	}
	if _, err := New("chat", Params{Users: 3, Speed: 2}); err == nil {
		t.Error("speed with users accepted")
	}
	if _, err := New("chat", Params{Speed: -1}); err == nil {
		t.Error("negative speed accepted")
	}
}
