package bench

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"p50", vals, 50, 5},
		{"p90", vals, 90, 9},
		{"p99", vals, 99, 10},
		{"p100", vals, 100, 10},
		{"p0 is the minimum", vals, 0, 1},
		{"single", []float64{3}, 99, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Percentile(tt.sorted, tt.p); got != tt.want {
				t.Fatalf("Percentile(%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestImbalanceIndex(t *testing.T) {
	tests := []struct {
		name    string
		windows [][]float64
		n       int
		want    float64
	}{
		{"even split", [][]float64{{5, 5, 5, 5}}, 4, 1},
		{"all on one", [][]float64{{0, 20, 0, 0}}, 4, 4},
		{"empty windows are skipped", [][]float64{{0, 0}, {1, 1}, {0, 0}}, 2, 1},
		{"mean over windows", [][]float64{{1, 1}, {2, 0}}, 2, 1.5},
		{"nothing routed", [][]float64{{0, 0}}, 2, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := imbalanceIndex(tt.windows, tt.n); math.Abs(got-tt.want) > 1e-12 {
				t.Fatalf("imbalanceIndex = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestShareSeriesMergesWindows(t *testing.T) {
	windows := make([][]float64, 240)
	for i := range windows {
		windows[i] = []float64{1, 3}
	}
	win, series := shareSeries(windows, 2, 10*time.Second, 2400*time.Second)
	if win != 20 || len(series) != 120 {
		t.Fatalf("window %vs, %d points; want 20s, 120", win, len(series))
	}
	if series[0][0] != 0.25 || series[0][1] != 0.75 {
		t.Fatalf("shares %v, want [0.25 0.75]", series[0])
	}
}

func TestParseFlap(t *testing.T) {
	tests := []struct {
		in      string
		want    Flap
		wantErr bool
	}{
		{"replica-1:15s", Flap{"replica-1", 15 * time.Second}, false},
		{"replica-2:1m", Flap{"replica-2", time.Minute}, false},
		{"replica-1", Flap{}, true},
		{":15s", Flap{}, true},
		{"replica-1:soon", Flap{}, true},
		{"replica-1:-5s", Flap{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseFlap(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseFlap(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestParseSlow(t *testing.T) {
	tests := []struct {
		in      string
		want    Slow
		wantErr bool
	}{
		{"replica-4:2", Slow{"replica-4", 2}, false},
		{"replica-1:1.5", Slow{"replica-1", 1.5}, false},
		{"replica-1:1", Slow{"replica-1", 1}, false},
		{"replica-1", Slow{}, true},
		{":2", Slow{}, true},
		{"replica-1:fast", Slow{}, true},
		{"replica-1:0.5", Slow{}, true},
		{"replica-1:NaN", Slow{}, true},
		{"replica-1:+Inf", Slow{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSlow(tt.in)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("ParseSlow(%q) = %v, %v; want %v, err %v", tt.in, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestFlapDown(t *testing.T) {
	f := Flap{Replica: "replica-1", Period: 15 * time.Second}
	for _, tt := range []struct {
		at   time.Duration
		down bool
	}{{0, false}, {14 * time.Second, false}, {15 * time.Second, true}, {29 * time.Second, true}, {30 * time.Second, false}} {
		if got := f.down(tt.at); got != tt.down {
			t.Errorf("down(%v) = %v, want %v", tt.at, got, tt.down)
		}
	}
}

func TestReplicaIndex(t *testing.T) {
	for _, tt := range []struct {
		name string
		n    int
		want int
		ok   bool
	}{{"replica-1", 4, 0, true}, {"replica-4", 4, 3, true}, {"replica-5", 4, 0, false}, {"replica-01", 4, 0, false}, {"r1", 4, 0, false}} {
		got, ok := replicaIndex(tt.name, tt.n)
		if got != tt.want || ok != tt.ok {
			t.Errorf("replicaIndex(%q) = %d, %v; want %d, %v", tt.name, got, ok, tt.want, tt.ok)
		}
	}
}
