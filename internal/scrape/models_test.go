package scrape

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A replica listing 20,000 models on /v1/models, or one 4 MB model id, made
// every model a routing key and a label value. The list is bounded in count
// and name length; what is dropped is logged once per replica and reported.
func TestRefreshModelsBounded(t *testing.T) {
	many := make([]string, 20000)
	for i := range many {
		many[i] = fmt.Sprintf("m%05d", i)
	}
	long := strings.Repeat("x", 600)
	tests := []struct {
		name        string
		models      []string
		wantKept    int
		wantDropped int
	}{
		{"within bounds", []string{"a", "b"}, 2, 0},
		{"too many", many, 1000, 19000},
		{"too long a name", []string{"a", long, "b"}, 2, 1},
		{"control characters", []string{"a", "b\nc", "\xff"}, 1, 2},
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fake := NewFake()
			fake.SetModels("http://r", tc.models, nil)
			sink := newSink(16)
			var logs bytes.Buffer
			var reported []int
			s := New(fake, sink, Options{
				Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
				ModelsInterval: time.Second,
				OnModelsDropped: func(name string, n int) {
					reported = append(reported, n)
				},
			})
			st := &loopState{}
			tg := Target{Name: "r", URL: "http://r"}
			s.refreshModels(context.Background(), tg, st, t0)
			s.refreshModels(context.Background(), tg, st, t0.Add(2*time.Second))
			got := sink.models["r"]
			if len(got) != 1 || len(got[0]) != tc.wantKept {
				t.Fatalf("models set %d times (%d kept the first time); want once with %d", len(got), len(got[0]), tc.wantKept)
			}
			for _, m := range got[0] {
				if len(m) > DefaultMaxModelNameBytes {
					t.Errorf("kept a %d-byte name", len(m))
				}
			}
			warns := strings.Count(logs.String(), "replica advertises models beyond the bounds")
			if tc.wantDropped == 0 {
				if warns != 0 || len(reported) != 2 || reported[0] != 0 {
					t.Errorf("warned %d times, reported %v; want no warning and 0 at every refresh", warns, reported)
				}
				return
			}
			if warns != 1 {
				t.Errorf("warned %d times, want once per replica:\n%s", warns, logs.String())
			}
			if len(reported) != 2 || reported[0] != tc.wantDropped {
				t.Errorf("reported %v, want %d at every refresh", reported, tc.wantDropped)
			}
		})
	}
}
