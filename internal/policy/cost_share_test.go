package policy

import (
	"fmt"
	"testing"
)

// fleetFake is a fakePrecise whose events also count the blocks the
// replicas computed and measure their marginal reuse (fleetEvents).
type fleetFake struct {
	fakePrecise
	computed uint64
	margin   float64
	reuse    map[string]float64
}

func (f *fleetFake) Computed() uint64        { return f.computed }
func (f *fleetFake) SetMargin(share float64) { f.margin = share }
func (f *fleetFake) MarginalReuse(rep string) (float64, bool) {
	m, ok := f.reuse[rep]
	return m, ok
}

// TestCostFleetViewFromEvents: a balancer that routes about every block
// the events report computed keeps its own index's marginal reuse and
// KV held; one that routes a quarter of them (one of four balancers)
// reads each publishing replica's marginal reuse from the events and
// scales the KV its requests hold by its share.
func TestCostFleetViewFromEvents(t *testing.T) {
	for _, c := range []struct {
		others    uint64 // blocks other balancers route per block of this one's
		wantFleet bool
	}{{0, false}, {3, true}} {
		t.Run(fmt.Sprintf("others=%d", c.others), func(t *testing.T) {
			p := newCost(t, nil)
			cands := costCands(4)
			f := &fleetFake{
				fakePrecise: fakePrecise{"a": {}, "b": {}, "c": {}}, // d does not publish
				reuse:       map[string]float64{"a": 0.9, "b": 0.1, "c": 0.5, "d": 0.7},
			}
			p.SetPreciseIndex(f)
			if f.margin != p.cfg.MarginWindow {
				t.Fatalf("events' margin %v, want margin_window %v", f.margin, p.cfg.MarginWindow)
			}
			const blocks = 100
			routed := 0.0 // blocks sent to publishing replicas to compute
			for i := range 40 {
				got := p.Choose(costPrompt(fmt.Sprint("s", i, "-"), blocks, 0, ""), cands, t0)
				if got.CachedTokens != 0 {
					t.Fatalf("request %d: %d cached of a new prompt", i, got.CachedTokens)
				}
				if cands[got.Index].Name != "d" {
					routed += blocks
				}
				// Its prompt is computed, and the others' as many times.
				f.computed += blocks * (1 + c.others)
			}
			p.noteComputed()
			share, fleet := p.fleetView()
			if fleet != c.wantFleet {
				t.Fatalf("fleet view %v (share %.3f), want %v", fleet, share, c.wantFleet)
			}
			for id, name := range p.names {
				m, ok := p.marginalReuse(int32(id))
				own, ownOK := p.index.MarginalReuse(int32(id))
				if fleet && name != "d" {
					if !ok || m != f.reuse[name] {
						t.Errorf("%s: marginal reuse %.3f, %v; want the events' %.3f", name, m, ok, f.reuse[name])
					}
					continue
				}
				if m != own || ok != ownOK {
					t.Errorf("%s: marginal reuse %.3f, %v; want its own index's %.3f, %v", name, m, ok, own, ownOK)
				}
			}
			want := 1.0
			if fleet {
				want = 1 / share
				// Its share of what publishing replicas computed.
				if w := routed / float64(f.computed); share < w-0.001 || share > w+0.001 {
					t.Fatalf("share %.3f, want %.3f", share, w)
				}
			}
			if got := p.heldKV(1); got != want {
				t.Errorf("heldKV(1) = %.3f, want %.3f", got, want)
			}
		})
	}
}

// TestCostFleetViewNeedsEvents: without an event-fed index, or with one
// that counts nothing, cost keeps its own view.
func TestCostFleetViewNeedsEvents(t *testing.T) {
	p := newCost(t, nil)
	cands := costCands(4)
	p.SetPreciseIndex(fakePrecise{"a": {}, "b": {}}) // no fleetEvents
	for i := range 20 {
		p.Choose(costPrompt(fmt.Sprint("s", i, "-"), 100, 0, ""), cands, t0)
	}
	if _, fleet := p.fleetView(); fleet || p.share.own != 0 || p.share.all != 0 {
		t.Fatalf("fleet view without fleetEvents: %+v", p.share)
	}
}
