//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFailoverUnderLoad is guarantee 5: a replica killed (refuse fault: its
// listener and every open connection closed) under steady streaming load
// loses no request that had not started streaming: those fail over before
// the first byte to another replica (at most proxy.max_attempts). Streams
// that were cut mid-way end with an SSE error event in OpenAI's error shape,
// and llmlb_stream_errors_total counts exactly them.
//
// Timers: scrape 2s/1s, near the defaults 3s/1s (the dead replica is ejected
// by its cut streams' transport errors or the next scrape; each request sent
// to it before that fails over). TestFailoverBeforeFirstByte pins down the
// failover itself.
func TestFailoverUnderLoad(t *testing.T) {
	const (
		n      = 4
		victim = 2 // sim-3
	)
	name := simName(victim)
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+yamlTimers(2*time.Second, time.Second, 30*time.Second, 5*time.Minute, 15*time.Second))
	srv.waitAllLive(t, n)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		stop    atomic.Bool
		started = map[string]time.Time{} // streams from the victim in progress, by key, and when they started
		mu      sync.Mutex
		replies []reply
		wg      sync.WaitGroup
	)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("%d/%d", w, i)
				r := srv.chat(ctx, chatReq{Session: fmt.Sprintf("fo-%d-%d", w, i/3), MaxTokens: 200, Stream: true,
					OnStart: func(replica string) {
						if replica == name {
							mu.Lock()
							started[key] = time.Now()
							mu.Unlock()
						}
					}})
				mu.Lock()
				delete(started, key)
				replies = append(replies, r)
				mu.Unlock()
			}
		}()
	}
	// Kill the victim in steady state (past the first wave, whose requests
	// have not started streaming yet) while it holds streams.
	waitFor(t, 30*time.Second, "steady state", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) >= 24, fmt.Sprintf("%d replies", len(replies))
	})
	// Streams of 200 tokens last about 5 s: wait for one that started
	// under a second ago, so that it is still streaming when the fault
	// lands (one about to end could finish first, and nothing is cut).
	waitFor(t, 30*time.Second, name+" streaming to clients", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		young := 0
		for _, at := range started {
			if time.Since(at) < time.Second {
				young++
			}
		}
		return young >= 1 && len(started) >= 2, fmt.Sprintf("%d streams from %s in progress, %d started under 1 s ago", len(started), name, young)
	})
	sim.fault(t, victim, `{"mode":"refuse"}`)
	srv.waitState(t, name, "EJECTED", 20*time.Second)
	mu.Lock()
	atEjection := len(replies)
	mu.Unlock()
	// Keep the load on for as many requests again after the ejection.
	waitFor(t, 60*time.Second, "load after the ejection", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return len(replies) >= 2*atEjection+32, fmt.Sprintf("%d replies", len(replies))
	})
	stop.Store(true)
	wg.Wait()

	ok, cut, lost := 0, 0, 0
	for _, r := range replies {
		switch {
		case r.ok():
			ok++
		case r.ErrorEvent && r.Status == 200:
			cut++
			if r.Replica != name {
				t.Errorf("a stream from %s was cut: %+v", r.Replica, r)
			}
		default:
			lost++
			t.Errorf("lost request (not cut mid-stream): status %d replica %q err %v body %.200s", r.Status, r.Replica, r.Err, r.Body)
		}
	}
	mfs := srv.metrics(t)
	streamErrs := sumMetric(mfs, "llmlb_stream_errors_total", nil)
	failovers := sumMetric(mfs, "llmlb_failovers_total", nil)
	if int(streamErrs) != cut {
		t.Errorf("llmlb_stream_errors_total = %v, clients saw %d cut streams", streamErrs, cut)
	}
	if cut == 0 {
		t.Errorf("no stream was cut although the victim was streaming when it died")
	}
	t.Logf("GUARANTEE 5 failover: %d requests, %d ok, %d cut mid-stream with an error event, %d lost; llmlb_stream_errors_total %v, llmlb_failovers_total %v; by replica %v",
		len(replies), ok, cut, lost, streamErrs, failovers, tally(replies))
}

// TestFailoverBeforeFirstByte is the other half of guarantee 5: requests
// sent to a replica that died but is not ejected yet (no scrape in between,
// request failures not counted to ejection) fail over before their first
// byte and succeed elsewhere: 8 simultaneous streams on 4 replicas, one of
// them refusing, all complete and llmlb_failovers_total counts every
// attempt that went to the dead one.
func TestFailoverBeforeFirstByte(t *testing.T) {
	const (
		n      = 4
		victim = 2
	)
	name := simName(victim)
	sim := startSim(t, n)
	srv := startServe(t, sim.replicasYAML(n)+`scrape:
  interval: 60s
  timeout: 2s
routing:
  health:
    request_failures_to_eject: 100
`)
	srv.waitAllLive(t, n)
	sim.fault(t, victim, `{"mode":"refuse"}`)
	if st := srv.replicas(t)[name].State; st != "LIVE" {
		t.Fatalf("%s is %s; the test needs it dead but LIVE", name, st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		mu      sync.Mutex
		replies []reply
		wg      sync.WaitGroup
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := srv.chat(ctx, chatReq{Session: fmt.Sprintf("pre-%d", i), MaxTokens: 20, Stream: true})
			mu.Lock()
			replies = append(replies, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	for _, r := range replies {
		if !r.ok() || r.Replica == name {
			t.Errorf("request not completed elsewhere: %+v", r)
		}
	}
	failovers := sumMetric(srv.metrics(t), "llmlb_failovers_total", map[string]string{"replica": name})
	if failovers < 1 {
		t.Errorf("llmlb_failovers_total{replica=%q} = %v, want the requests sent to it counted", name, failovers)
	}
	t.Logf("GUARANTEE 5 failover before the first byte: 8 streams, %s dead but LIVE: all ok, by replica %v, llmlb_failovers_total{%s} %v",
		name, tally(replies), name, failovers)
}
