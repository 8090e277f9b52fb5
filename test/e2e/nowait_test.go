//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestNoWaitColdStart is guarantee 6 of docs/GUARANTEES.md (selection step 2, "no-wait", docs/ROUTING.md): a
// replica with a queue (vllm:num_requests_waiting > 0) takes no new session
// while a LIVE replica without a queue exists, even when it holds the warm
// prefix pin of the sessions' shared system prompt: the new sessions start
// cold on the idle replicas rather than wait in its queue.
//
// Timers: scrape 200ms/150ms (default 3s/1s: the queue is seen up to 3 s later;
// until then the balancer's own in-flight count steers by load).
//
// Policy cost runs the same scenario: the queue it scrapes is work ahead
// of the new session, worth more than the warm prefix.
func TestNoWaitColdStart(t *testing.T) {
	for _, policy := range []string{"llmlb", "cost"} {
		t.Run(policy, func(t *testing.T) { testNoWaitColdStart(t, policy) })
	}
}

func testNoWaitColdStart(t *testing.T, policy string) {
	const n = 3
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+"scrape:\n  interval: 200ms\n  timeout: 150ms\nrouting:\n  policy: "+policy+"\n")
	srv.waitAllLive(t, n)
	system := "You are the agent of project nowait. " + strings.Repeat("shared context ", 200)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	first := srv.chat(ctx, chatReq{Session: "warm", System: system, MaxTokens: 2})
	if !first.ok() {
		t.Fatalf("first request: %+v", first)
	}
	hot := first.Replica // holds the prefix pin of the shared prompt
	hotIdx := -1
	for i := range n {
		if simName(i) == hot {
			hotIdx = i
		}
	}
	if hotIdx < 0 || policy == "llmlb" && !hasPin(srv.pins(t), "prefix", hot) {
		t.Fatalf("no prefix pin on %q after the first request: %+v", hot, srv.pins(t))
	}

	// Fill the hot replica past its 64 slots directly (not through llmlb).
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			directStream(loadCtx, sim.urls[hotIdx], fmt.Sprintf("direct %d", i), 5000)
		}()
	}
	defer func() { stopLoad(); wg.Wait() }()
	waitFor(t, 30*time.Second, hot+" queue seen by the scraper", func() (bool, string) {
		r := srv.replicas(t)[hot]
		return r.ScrapedWaiting > 0, fmt.Sprintf("scraped running %v waiting %v", r.ScrapedRunning, r.ScrapedWaiting)
	})

	var (
		mu      sync.Mutex
		replies []reply
		cw      sync.WaitGroup
	)
	for i := range 12 {
		cw.Add(1)
		go func() {
			defer cw.Done()
			r := srv.chat(ctx, chatReq{Session: fmt.Sprintf("new-%d", i), System: system, MaxTokens: 8, Stream: true})
			mu.Lock()
			replies = append(replies, r)
			mu.Unlock()
		}()
		if i%4 == 3 {
			cw.Wait() // 3 waves of 4
		}
	}
	cw.Wait()
	if w := srv.replicas(t)[hot].ScrapedWaiting; w == 0 {
		t.Fatalf("%s's queue drained during the test; nothing was proved", hot)
	}
	for _, r := range replies {
		if !r.ok() {
			t.Errorf("new session failed: %+v", r)
		}
		if r.Replica == hot {
			t.Errorf("a new session went to %s, which has a queue (route %s)", hot, r.Route)
		}
	}
	t.Logf("GUARANTEE 6 no-wait (%s): %s queued (waiting %v) with the warm prefix; 12 new sessions -> by replica %v",
		policy, hot, srv.replicas(t)[hot].ScrapedWaiting, tally(replies))
}

func hasPin(ps []pinStatus, kind, replica string) bool {
	for _, p := range ps {
		if p.Kind == kind && p.Replica == replica {
			return true
		}
	}
	return false
}

// directStream sends one streaming completion straight to a replica and
// reads it until ctx ends.
func directStream(ctx context.Context, url, prompt string, maxTokens int) {
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := httpClient.Do(req)
	if err != nil {
		return
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, res.Body)
}
