package bench

import (
	"testing"
	"time"
)

// TestKVEventsMakeCostsIndexExact runs cost on chat, whose KV cache is
// oversubscribed, with its own index and then fed by the engines' events:
// the events' index expects what the engines then find; the guess does not.
// A policy without an index reports no accuracy.
func TestKVEventsMakeCostsIndexExact(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates 30 minutes of chat three times")
	}
	run := func(events bool, lag time.Duration, loss float64) Result {
		o := testOptions(t, "chat", 4, 30*time.Minute, "cost", "rr")
		o.KVEvents, o.KVEventsLag, o.KVEventsLoss = events, lag, loss
		rep, err := Run(t.Context(), o)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Results[1].IndexAccuracy != 0 {
			t.Errorf("rr reports an index accuracy of %v", rep.Results[1].IndexAccuracy)
		}
		return rep.Results[0]
	}
	guess, exact := run(false, 0, 0), run(true, 0, 0)
	if guess.IndexAccuracy <= 0 || guess.IndexAccuracy >= 1 {
		t.Errorf("approximate index accuracy %v, want in (0, 1) on an oversubscribed cache", guess.IndexAccuracy)
	}
	if exact.IndexAccuracy < 0.98 || exact.IndexAccuracy <= guess.IndexAccuracy {
		t.Errorf("event-fed index accuracy %v, want >= 0.98 and above the guess's %v", exact.IndexAccuracy, guess.IndexAccuracy)
	}
	// A lost batch clears the replica's entries: the index then knows less,
	// but what it expects is still there.
	lossy := run(true, 0, 0.05)
	if lossy.IndexAccuracy < 0.98 {
		t.Errorf("with 5%% of batches lost, accuracy %v, want >= 0.98", lossy.IndexAccuracy)
	}
}
