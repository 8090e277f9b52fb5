package engine_test

import (
	"fmt"
	"time"

	"github.com/llmlb/llmlb/internal/engine"
	"github.com/llmlb/llmlb/internal/tokenize"
)

// A virtual-clock driver: bring the engine to each arrival, add it, and
// between arrivals advance from event to event. The second request repeats
// the first prompt and is served mostly from the prefix cache.
func Example() {
	p, _ := engine.Lookup(engine.DefaultProfile)
	e := engine.New(p)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	prompt := tokenize.FromText(tokenize.RenderChat([]tokenize.Message{
		{Role: "system", Content: "You are a helpful assistant. " + string(make([]byte, 8000))},
		{Role: "user", Content: "Hello!"},
	}))
	arrivals := []time.Time{t0, t0.Add(5 * time.Second)}
	emit := func(ev engine.Event) {
		if ev.Kind == engine.FirstToken {
			ttft := ev.At.Sub(arrivals[ev.ID-1])
			fmt.Printf("request %d: TTFT %v, %d of %d prompt tokens cached\n", ev.ID, ttft, ev.CachedTokens, prompt.Tokens)
		}
	}
	for i, at := range arrivals {
		for next, ok := e.NextEvent(); ok && !next.After(at); next, ok = e.NextEvent() {
			e.Advance(next, emit)
		}
		e.Advance(at, emit)
		if err := e.Add(engine.Request{ID: uint64(i + 1), Prompt: prompt, MaxTokens: 32}, at); err != nil {
			fmt.Println(err)
		}
	}
	for next, ok := e.NextEvent(); ok; next, ok = e.NextEvent() {
		e.Advance(next, emit)
	}
	st := e.Stats()
	fmt.Printf("finished %d, prefix cache hits %d of %d tokens\n", st.Finished, st.PrefixHitTokens, st.PrefixQueryTokens)
	// Output:
	// request 1: TTFT 48.559826ms, 0 of 2018 prompt tokens cached
	// request 2: TTFT 22.526653ms, 2016 of 2018 prompt tokens cached
	// finished 2, prefix cache hits 2016 of 4036 tokens
}
