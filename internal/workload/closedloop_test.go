package workload

import (
	"slices"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/tokenize"
)

// popAll pops every request pending now, without completing any.
func popAll(w Workload) []*Request {
	var out []*Request
	for {
		if _, ok := w.Peek(); !ok {
			return out
		}
		out = append(out, w.Pop())
	}
}

func TestNextTurnOnlyAfterWholeBurstCompletes(t *testing.T) {
	w, err := New("agentic", Params{Seed: 1, Duration: time.Hour, Users: 1})
	if err != nil {
		t.Fatal(err)
	}
	burst := popAll(w)
	if len(burst) < agenticSpec.burst.Lo || len(burst) > agenticSpec.burst.Hi {
		t.Fatalf("first turn has %d requests, want %v", len(burst), agenticSpec.burst)
	}
	for _, r := range burst {
		if r.Turn != 1 || r.At != burst[0].At || r.Session != burst[0].Session {
			t.Fatalf("burst request %+v differs from the first", r)
		}
	}
	if w.Done() {
		t.Fatal("Done with a burst in flight")
	}
	// All but one complete: still nothing to send.
	end := burst[0].At + 5*time.Second
	for _, r := range burst[1:] {
		w.Complete(r, end-time.Second)
	}
	if at, ok := w.Peek(); ok {
		t.Fatalf("turn 2 due at %v before the burst completed", at)
	}
	// Duplicate completions, foreign and nil requests change nothing.
	w.Complete(burst[1], end)
	w.Complete(&Request{ID: 999}, end)
	w.Complete(nil, end)
	if _, ok := w.Peek(); ok {
		t.Fatal("turn 2 scheduled by a duplicate or foreign completion")
	}
	w.Complete(burst[0], end)
	at, ok := w.Peek()
	if !ok {
		t.Fatal("no turn 2 after the burst completed")
	}
	if think := at - end; think < agenticSpec.think.Lo || think > agenticSpec.think.Hi {
		t.Errorf("think time %v, want %v..%v after the last completion", think, agenticSpec.think.Lo, agenticSpec.think.Hi)
	}
	if r := w.Pop(); r.Turn != 2 || r.Session != burst[0].Session {
		t.Errorf("next request is turn %d of %q, want turn 2 of %q", r.Turn, r.Session, burst[0].Session)
	}
}

func TestUsersBoundConcurrentSessions(t *testing.T) {
	for _, name := range []string{"agentic", "chat"} {
		t.Run(name, func(t *testing.T) {
			w, err := New(name, Params{Seed: 4, Duration: time.Hour, Users: 3})
			if err != nil {
				t.Fatal(err)
			}
			reqs := popAll(w)
			sessions := map[string]bool{}
			for _, r := range reqs {
				sessions[r.Session] = true
				if r.Turn != 1 {
					t.Fatalf("turn %d without any completion", r.Turn)
				}
			}
			if len(sessions) != 3 || w.Done() {
				t.Errorf("%d sessions open without completions (Done=%v), want 3 users' first turns", len(sessions), w.Done())
			}
		})
	}
}

func TestPoissonSessionsKeepArrivingWithoutCompletions(t *testing.T) {
	w, err := New("chat", Params{Seed: 4, Duration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reqs := popAll(w)
	for _, r := range reqs {
		if r.Turn != 1 {
			t.Fatalf("turn %d without any completion", r.Turn)
		}
	}
	want := chatSpec.defaultRate(DefaultReplicas) * 3600
	if !within(float64(len(reqs)), want, 0.1) {
		t.Errorf("%d sessions began in an hour, want ~%.0f", len(reqs), want)
	}
	if w.Done() {
		t.Error("Done while sessions wait for completions")
	}
	for _, r := range reqs {
		w.Complete(r, 59*time.Minute+59*time.Second)
	}
	if _, ok := w.Peek(); ok || !w.Done() {
		t.Error("turns scheduled past the horizon")
	}
}

func TestProfileIsWhatAClientWouldSend(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			w, err := New(name, Params{Seed: 6, Duration: 10 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range drive(t, w, fixed(2*time.Second)) {
				p := r.Profile
				switch {
				case p.Model != "":
					t.Fatalf("request %d: model %q", r.ID, p.Model)
				case p.SessionKey != r.Session:
					t.Fatalf("request %d: session key %q, session %q", r.ID, p.SessionKey, r.Session)
				case p.PromptTokens != r.Prompt.Tokens:
					t.Fatalf("request %d: profile says %d prompt tokens, prompt has %d", r.ID, p.PromptTokens, r.Prompt.Tokens)
				case p.OutputTokens != DeclaredOutput:
					t.Fatalf("request %d: declared output %d, want %d (no oracle)", r.ID, p.OutputTokens, DeclaredOutput)
				case len(p.PromptBlocks) != r.Prompt.Tokens/tokenize.BlockSize || len(p.PromptBlocks) > 0 && &p.PromptBlocks[0] != &r.Prompt.Blocks[0]:
					t.Fatalf("request %d: profile blocks are not the prompt's", r.ID)
				case r.Output < 1:
					t.Fatalf("request %d: output %d", r.ID, r.Output)
				}
			}
		})
	}
}

func TestPrefixSharing(t *testing.T) {
	w, err := New("agentic", Params{Seed: 8, Duration: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(3*time.Second))

	// Requests of one project share every block inside its system prompt.
	sysBlocks := map[string]int{}
	for _, sp := range w.(*sessionGen).sys {
		sysBlocks[sp.prefixKey] = len(sp.hashes)
	}
	firstOf := map[string]*Request{}
	for _, r := range reqs {
		f, ok := firstOf[r.Profile.PrefixKey]
		if !ok {
			firstOf[r.Profile.PrefixKey] = r
			continue
		}
		if got, want := sharedBlocks(f.Prompt.Blocks, r.Prompt.Blocks), sysBlocks[r.Profile.PrefixKey]; got < want {
			t.Fatalf("requests %d and %d of one project share %d blocks, want >= %d", f.ID, r.ID, got, want)
		}
		if f.Session != r.Session && sharedBlocks(f.Prompt.Blocks, r.Prompt.Blocks) != sysBlocks[r.Profile.PrefixKey] {
			t.Fatalf("requests %d and %d of different sessions share more than the system prompt", f.ID, r.ID)
		}
	}

	// Turn k+1's first request starts with all of turn k's first request's
	// blocks; the other requests of a burst share the turn's full blocks and
	// then differ.
	primary := map[turnKey]*Request{}
	for _, r := range reqs {
		k := turnKey{r.Session, r.Turn, 0}
		p, ok := primary[k]
		if !ok {
			primary[k] = r
			if prev, ok := primary[turnKey{r.Session, r.Turn - 1, 0}]; ok {
				if got := sharedBlocks(prev.Prompt.Blocks, r.Prompt.Blocks); got != len(prev.Prompt.Blocks) {
					t.Fatalf("%s turn %d shares %d of turn %d's %d blocks", r.Session, r.Turn, got, r.Turn-1, len(prev.Prompt.Blocks))
				}
			}
			continue
		}
		if got := sharedBlocks(p.Prompt.Blocks, r.Prompt.Blocks); got != len(p.Prompt.Blocks) || len(r.Prompt.Blocks) <= got {
			t.Fatalf("parallel request %d shares %d of %d blocks with the turn's first (own %d)", r.ID, got, len(p.Prompt.Blocks), len(r.Prompt.Blocks))
		}
	}
}

func TestOneshotScenariosShareExactlyTheirPrefix(t *testing.T) {
	w, err := New("oneshot", Params{Seed: 8, Duration: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(time.Second))
	firstOf := map[string]*Request{}
	for _, r := range reqs {
		f, ok := firstOf[r.Profile.PrefixKey]
		if !ok {
			firstOf[r.Profile.PrefixKey] = r
			continue
		}
		if got := sharedBlocks(f.Prompt.Blocks, r.Prompt.Blocks); got != 2000/tokenize.BlockSize {
			t.Fatalf("requests %d and %d of one scenario share %d blocks, want %d", f.ID, r.ID, got, 2000/tokenize.BlockSize)
		}
	}
	var keys []string
	for k, f := range firstOf {
		keys = append(keys, k)
		for k2, g := range firstOf {
			if k != k2 && sharedBlocks(f.Prompt.Blocks, g.Prompt.Blocks) != 0 {
				t.Fatalf("scenarios %s and %s share blocks", k, k2)
			}
		}
	}
	if len(keys) != oneshotSpec.scenarios {
		t.Errorf("%d scenarios, want %d", len(keys), oneshotSpec.scenarios)
	}
}

func TestHandedOutBlocksNeverChange(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			w, err := New(name, Params{Seed: 12, Duration: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			var copies [][]uint64
			reqs := driveHook(t, w, fixed(time.Second), func(r *Request) {
				copies = append(copies, slices.Clone(r.Prompt.Blocks))
			})
			for i, r := range reqs {
				if !slices.Equal(r.Prompt.Blocks, copies[i]) {
					t.Fatalf("request %d's blocks changed after it was handed out", r.ID)
				}
			}
		})
	}
}

func TestManyUsersStartQuickly(t *testing.T) {
	// A large population must not cost quadratic time to set up.
	w, err := New("chat", Params{Seed: 1, Duration: time.Hour, Users: 200_000})
	if err != nil {
		t.Fatal(err)
	}
	if at, ok := w.Peek(); !ok || at < 0 {
		t.Fatalf("Peek = %v, %v", at, ok)
	}
}
