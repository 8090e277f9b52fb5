package bench

import (
	"time"

	"github.com/llmlb/llmlb/internal/engine"
)

// fifoEngine is a deliberately simple engine model for driver tests: slots
// requests run at once, each for prompt/prefillRate + output*perToken, the
// rest wait in FIFO order. It has no cache.
type fifoEngine struct {
	slots    int
	waiting  []fifoReq
	running  []fifoReq
	stats    engine.Stats
	perToken time.Duration
}

type fifoReq struct {
	r             engine.Request
	arrived       time.Time
	first, finish time.Time
	firstSent     bool
}

func newFIFOEngine() simEngine { return &fifoEngine{slots: 4, perToken: 20 * time.Millisecond} }

func (e *fifoEngine) Add(r engine.Request, now time.Time) error {
	e.waiting = append(e.waiting, fifoReq{r: r, arrived: now})
	e.start(now)
	return nil
}

func (e *fifoEngine) start(now time.Time) {
	for len(e.running) < e.slots && len(e.waiting) > 0 {
		q := e.waiting[0]
		e.waiting = e.waiting[1:]
		prefill := time.Duration(float64(q.r.Prompt.Tokens) / 16000 * float64(time.Second))
		q.first = now.Add(prefill + e.perToken)
		q.finish = q.first.Add(time.Duration(max(q.r.MaxTokens-1, 0)) * e.perToken)
		e.running = append(e.running, q)
		e.stats.PrefillComputed += uint64(q.r.Prompt.Tokens)
		e.stats.PrefixQueryTokens += uint64(q.r.Prompt.Tokens)
	}
	e.stats.Running, e.stats.Waiting = len(e.running), len(e.waiting)
}

func (e *fifoEngine) NextEvent() (time.Time, bool) {
	var t time.Time
	ok := false
	for _, q := range e.running {
		next := q.finish
		if !q.firstSent {
			next = q.first
		}
		if !ok || next.Before(t) {
			t, ok = next, true
		}
	}
	return t, ok
}

func (e *fifoEngine) Advance(now time.Time, emit func(engine.Event)) {
	for {
		t, ok := e.NextEvent()
		if !ok || t.After(now) {
			return
		}
		for i := 0; i < len(e.running); i++ {
			q := &e.running[i]
			if !q.firstSent && q.first.Equal(t) {
				q.firstSent = true
				emit(engine.Event{Kind: engine.FirstToken, ID: q.r.ID, At: t, OutputTokens: 1})
			}
			if q.firstSent && q.finish.Equal(t) {
				emit(engine.Event{Kind: engine.Finished, ID: q.r.ID, At: t, OutputTokens: q.r.MaxTokens})
				e.stats.GenerationTokens += uint64(q.r.MaxTokens)
				e.stats.Finished++
				e.running = append(e.running[:i], e.running[i+1:]...)
				i--
			}
		}
		e.start(t)
	}
}

func (e *fifoEngine) Stats() engine.Stats { return e.stats }
