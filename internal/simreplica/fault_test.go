package simreplica

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseFault(t *testing.T) {
	tests := []struct {
		spec    string
		want    Fault
		wantErr bool
	}{
		{spec: "refuse", want: Fault{Mode: Refuse}},
		{spec: "hang", want: Fault{Mode: Hang}},
		{spec: "recover", want: Fault{Mode: None}},
		{spec: "none", want: Fault{Mode: None}},
		{spec: "", want: Fault{Mode: None}},
		{spec: "error", want: Fault{Mode: Error, Rate: 1, Status: 503}},
		{spec: "error:rate=0.5,status=500", want: Fault{Mode: Error, Rate: 0.5, Status: 500}},
		{spec: "slow", want: Fault{Mode: Slow, Factor: 4}},
		{spec: "slow:factor=2.5", want: Fault{Mode: Slow, Factor: 2.5}},
		{spec: "break:after_tokens=10", want: Fault{Mode: Break, AfterTokens: 10}},
		{spec: "flap:period=15s", want: Fault{Mode: Flap, Period: 15 * time.Second}},
		{spec: "refuse:rate=1", want: Fault{Mode: Refuse}}, // parameters of other modes are dropped
		{spec: `{"mode":"error","rate":0.25,"status":502}`, want: Fault{Mode: Error, Rate: 0.25, Status: 502}},
		{spec: `{"mode":"flap","period":"2s"}`, want: Fault{Mode: Flap, Period: 2 * time.Second}},
		{spec: `{"mode":"flap","period":1.5}`, want: Fault{Mode: Flap, Period: 1500 * time.Millisecond}},
		{spec: "explode", wantErr: true},
		{spec: "error:rate=2", wantErr: true},
		{spec: "error:status=404", wantErr: true},
		{spec: "slow:factor=0.5", wantErr: true},
		{spec: "break:after_tokens=-1", wantErr: true},
		{spec: "flap:period=1ms", wantErr: true},
		{spec: "flap:period=soon", wantErr: true},
		{spec: "slow:speed=2", wantErr: true},
		{spec: "slow:factor", wantErr: true},
		{spec: `{"mode":`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			got, err := ParseFault(tt.spec)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParseFault(%q) error = %v, wantErr %v", tt.spec, err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ParseFault(%q) (-want +got):\n%s", tt.spec, diff)
			}
			// String and JSON round-trip to the same fault.
			again, err := ParseFault(got.String())
			if err != nil || again != got {
				t.Errorf("ParseFault(%q.String()=%q) = %+v, %v", tt.spec, got.String(), again, err)
			}
			b, err := json.Marshal(got)
			if err != nil {
				t.Fatal(err)
			}
			var back Fault
			if err := json.Unmarshal(b, &back); err != nil || back != got {
				t.Errorf("JSON round trip of %+v via %s = %+v, %v", got, b, back, err)
			}
		})
	}
}

func TestFaultRefusingTimeline(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	flap := Fault{Mode: Flap, Period: 10 * time.Second}
	tests := []struct {
		name     string
		f        Fault
		at       time.Duration
		refusing bool
		next     time.Duration // -1: never changes
	}{
		{"none never refuses", Fault{Mode: None}, 0, false, -1},
		{"hang does not refuse", Fault{Mode: Hang}, time.Hour, false, -1},
		{"refuse always", Fault{Mode: Refuse}, time.Hour, true, -1},
		{"flap starts down", flap, 0, true, 5 * time.Second},
		{"flap still down just before half", flap, 5*time.Second - 1, true, 5 * time.Second},
		{"flap up at half period", flap, 5 * time.Second, false, 10 * time.Second},
		{"flap down again after a period", flap, 10 * time.Second, true, 15 * time.Second},
		{"flap up in the third half", flap, 17 * time.Second, false, 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			now := t0.Add(tt.at)
			if got := tt.f.refusing(t0, now); got != tt.refusing {
				t.Errorf("refusing at +%v = %v, want %v", tt.at, got, tt.refusing)
			}
			next, ok := tt.f.nextChange(t0, now)
			if tt.next < 0 {
				if ok {
					t.Errorf("nextChange at +%v = %v, want none", tt.at, next.Sub(t0))
				}
				return
			}
			if !ok || !next.Equal(t0.Add(tt.next)) {
				t.Errorf("nextChange at +%v = +%v (ok=%v), want +%v", tt.at, next.Sub(t0), ok, tt.next)
			}
			if tt.f.refusing(t0, next) == tt.refusing {
				t.Errorf("refusing did not change at nextChange +%v", next.Sub(t0))
			}
		})
	}
}
