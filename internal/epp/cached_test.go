package epp_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/request"
)

// TestCachedTokensReachCost: behind a gateway too, the prompt tokens a
// replica reports it found cached (usage.prompt_tokens_details) reach
// policy cost, which learns from them the share of an in-flight prefix's
// hit the replica computes again. The first request is picked and never
// relayed, so it waits for its first token; the second shares its prefix,
// is relayed, and the replica (which never saw the first) reports none of
// it cached: the replica's share (the decision detail's recomputed_share)
// goes from 0 to 1/32.
func TestCachedTokensReachCost(t *testing.T) {
	r := startRig(t, 1)
	bal := r.srv.Balancer()
	bal.SetExplain(true)
	shared := strings.Repeat("You are a careful assistant who reads the whole document. ", 40)
	body := func(question string) []byte {
		b, err := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4,
			"messages": []map[string]string{{"role": "user", "content": shared + strings.Repeat(question, 20)}}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(r.conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := &envoy{stream: st, c: call{mode: fullDuplex, body: body(" first question")}}
	if _, err := first.request(); err != nil {
		t.Fatal(err)
	}
	if _, code, out, err := r.do(ctx, r.conn, call{mode: fullDuplex, body: body(" second question")}, false); err != nil || code != http.StatusOK {
		t.Fatalf("second request: %d %s %v", code, out, err)
	}

	prof, err := request.Parse(r.srv.RequestConfig(), "/v1/chat/completions", http.Header{}, body(" third question"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := bal.Select(&prof, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer bal.Release(res, balancer.OutcomeCanceled, time.Now())
	if d := res.Explanation.Detail; !strings.Contains(d, "recomputed_share=0.031") {
		t.Fatalf("third decision's detail %q: want the share learned from the second's report (1/32)", d)
	}
}
