package ui

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/policy"
	"github.com/llmlb/llmlb/internal/request"
)

// TestSnapshotShowsPredictionError: the replicas' rows carry how far cost's
// TTFT estimates were off, for the dashboard's "TTFT est. error" column.
func TestSnapshotShowsPredictionError(t *testing.T) {
	cfg := balancer.DefaultConfig()
	cfg.Policy = policy.NameCost
	bal, err := balancer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := bal.AddReplica(balancer.ReplicaSpec{Name: "a", URL: "http://a"}, t0); err != nil {
		t.Fatal(err)
	}
	bal.ObserveScrape("a", balancer.Snapshot{}, nil, t0)
	d := New(Options{Balancer: bal, Now: func() time.Time { return t0 }})
	res, err := bal.Select(&request.Profile{Model: "m", PromptTokens: 4000}, t0)
	if err != nil {
		t.Fatal(err)
	}
	est := res.Explanation.Estimate
	bal.FirstToken(res, t0.Add(time.Duration(est*4*float64(time.Second)))) // four times slower
	bal.Release(res, balancer.OutcomeOK, t0.Add(time.Minute))

	s := d.Snapshot(t0.Add(time.Minute))
	if len(s.Replicas) != 1 {
		t.Fatalf("%d replicas", len(s.Replicas))
	}
	r := s.Replicas[0]
	if r.TTFTPredictions != 1 || r.TTFTPredictionError < 0.74 || r.TTFTPredictionError > 0.76 {
		t.Errorf("prediction error %v over %d, want 0.75 over 1", r.TTFTPredictionError, r.TTFTPredictions)
	}
	out, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"ttft_prediction_error":`, `"ttft_prediction_ratio":`, `"ttft_predictions":1`} {
		if !strings.Contains(string(out), key) {
			t.Errorf("row JSON lacks %s: %s", key, out)
		}
	}
}
