package workload

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNewRejectsBadInput(t *testing.T) {
	tests := []struct {
		name    string
		wl      string
		p       Params
		wantErr string
	}{
		{"unknown name", "bursty", Params{}, "unknown workload"},
		{"negative duration", "chat", Params{Duration: -time.Second}, "negative duration"},
		{"negative rate", "oneshot", Params{Rate: -1}, "rate must be"},
		{"NaN rate", "agentic", Params{Rate: math.NaN()}, "rate must be"},
		{"infinite rate", "longshort", Params{Rate: math.Inf(1)}, "rate must be"},
		{"negative users", "agentic", Params{Users: -2}, "negative users"},
		{"negative replicas", "chat", Params{Replicas: -1}, "negative replicas"},
		{"users on open loop", "oneshot", Params{Users: 5}, "Poisson arrivals"},
		{"users on mixed", "mixed", Params{Users: 5}, "Poisson arrivals"},
		{"users and rate", "agentic", Params{Users: 5, Rate: 0.1}, "either users or a session rate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := New(tt.wl, tt.p)
			if err == nil || w != nil {
				t.Fatalf("New(%q, %+v) = %v, %v; want an error", tt.wl, tt.p, w, err)
			}
			if !strings.HasPrefix(err.Error(), "workload: ") || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q, want prefix %q and %q", err, "workload: ", tt.wantErr)
			}
		})
	}
	if _, err := New("nope", Params{}); !errors.Is(err, ErrUnknownWorkload) {
		t.Errorf("unknown name: error %v does not wrap ErrUnknownWorkload", err)
	}
}

// digest summarises everything the benchmark sees of a request sequence.
func digest(reqs []*Request) uint64 {
	h := fnv.New64a()
	var x uint64
	for _, r := range reqs {
		fmt.Fprintf(h, "%d %d %s %d %d %d %s %s %d %d|", r.ID, r.At, r.Session, r.Turn, r.Prompt.Tokens, r.Output,
			r.Profile.SessionKey, r.Profile.PrefixKey, r.Profile.PromptTokens, r.Profile.OutputTokens)
		for _, b := range r.Prompt.Blocks {
			x = mix(x, b)
		}
	}
	return mix(h.Sum64(), x)
}

func TestDeterministicForASeed(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			run := func(seed int64) uint64 {
				w, err := New(name, Params{Seed: seed, Duration: 10 * time.Minute})
				if err != nil {
					t.Fatal(err)
				}
				return digest(drive(t, w, fixed(4*time.Second)))
			}
			a, b, c := run(7), run(7), run(8)
			if a != b {
				t.Errorf("same seed gave different sequences")
			}
			if a == c {
				t.Errorf("seeds 7 and 8 gave the same sequence")
			}
		})
	}
}

// turnKey names one request by its place in its session, independent of ids.
type turnKey struct {
	session string
	turn, i int
}

func TestSessionContentIndependentOfTiming(t *testing.T) {
	// Policies change completion times; the same session must still say the
	// same things, so that every policy is measured on the same traffic.
	for _, p := range []Params{{Seed: 3, Duration: 30 * time.Minute}, {Seed: 3, Duration: 30 * time.Minute, Users: 8}} {
		for _, name := range []string{"agentic", "chat"} {
			t.Run(fmt.Sprintf("%s users=%d", name, p.Users), func(t *testing.T) {
				content := func(service time.Duration) map[turnKey][2]int {
					w, err := New(name, p)
					if err != nil {
						t.Fatal(err)
					}
					m := map[turnKey][2]int{}
					i, prev := 0, turnKey{}
					for _, r := range drive(t, w, fixed(service)) {
						if r.Session == prev.session && r.Turn == prev.turn {
							i++
						} else {
							i = 0
						}
						prev = turnKey{r.Session, r.Turn, 0}
						m[turnKey{r.Session, r.Turn, i}] = [2]int{r.Prompt.Tokens, r.Output}
					}
					return m
				}
				fast, slow := content(time.Second), content(40*time.Second)
				common := 0
				for k, v := range slow {
					if f, ok := fast[k]; ok {
						common++
						if f != v {
							t.Fatalf("%v: fast run %v, slow run %v", k, f, v)
						}
					}
				}
				if common < len(slow)/2 {
					t.Errorf("only %d of %d requests in common", common, len(slow))
				}
			})
		}
	}
}

// sessionStats gathers per-session figures of a closed-loop run.
type sessionStats struct {
	sessions      int
	turns         []int // per session
	bursts        []int // per turn
	firstArrivals []time.Duration
}

func collectSessions(reqs []*Request) sessionStats {
	var st sessionStats
	turns := map[string]int{}
	var order []string
	burst := map[turnKey]int{}
	var turnOrder []turnKey
	for _, r := range reqs {
		if _, ok := turns[r.Session]; !ok {
			order = append(order, r.Session)
			st.firstArrivals = append(st.firstArrivals, r.At)
		}
		turns[r.Session] = max(turns[r.Session], r.Turn)
		k := turnKey{r.Session, r.Turn, 0}
		if burst[k] == 0 {
			turnOrder = append(turnOrder, k)
		}
		burst[k]++
	}
	st.sessions = len(order)
	for _, s := range order {
		st.turns = append(st.turns, turns[s])
	}
	for _, k := range turnOrder {
		st.bursts = append(st.bursts, burst[k])
	}
	return st
}

func mean(xs []int) float64 {
	s := 0.0
	for _, x := range xs {
		s += float64(x)
	}
	return s / float64(len(xs))
}

func TestSessionWorkloadStatistics(t *testing.T) {
	tests := []struct {
		spec       sessionSpec
		turns      float64
		burst      float64
		minPrompt  int // first turn's prompt is at least system + first message
		sharedSys  bool
		maxPrefixK int // distinct prefix keys
	}{
		{agenticSpec, 10, 6.5, 3000, true, 5},
		{chatSpec, 15, 1, 1500, false, math.MaxInt},
	}
	for _, tt := range tests {
		t.Run(tt.spec.name, func(t *testing.T) {
			const dur = 6 * time.Hour
			w, err := New(tt.spec.name, Params{Seed: 11, Duration: dur})
			if err != nil {
				t.Fatal(err)
			}
			// Short service so that sessions rarely hit the horizon.
			reqs := drive(t, w, fixed(500*time.Millisecond))
			st := collectSessions(reqs)
			// Sessions cut by the horizon would bias the turn count down.
			complete := st.turns[:len(st.turns)*9/10]
			if got := mean(complete); !within(got, tt.turns, 0.03) {
				t.Errorf("mean turns per session %.2f, want %.1f", got, tt.turns)
			}
			if got := mean(st.bursts); !within(got, tt.burst, 0.03) {
				t.Errorf("mean burst %.2f, want %.1f", got, tt.burst)
			}
			lo, hi := slices.Min(st.bursts), slices.Max(st.bursts)
			if lo != tt.spec.burst.Lo || hi != tt.spec.burst.Hi {
				t.Errorf("burst sizes %d..%d, want %d..%d", lo, hi, tt.spec.burst.Lo, tt.spec.burst.Hi)
			}
			wantRate := tt.spec.defaultRate(DefaultReplicas)
			gotRate := float64(st.sessions) / dur.Seconds()
			if !within(gotRate, wantRate, 0.05) {
				t.Errorf("session arrival rate %.4f/s, want %.4f/s", gotRate, wantRate)
			}
			prefixes := map[string]bool{}
			for _, r := range reqs {
				prefixes[r.Profile.PrefixKey] = true
				if r.Profile.SessionKey != r.Session || r.Session == "" {
					t.Fatalf("request %d: session key %q, session %q", r.ID, r.Profile.SessionKey, r.Session)
				}
				if r.Output < tt.spec.output.Lo || r.Output > tt.spec.output.Hi {
					t.Fatalf("request %d: output %d outside %v", r.ID, r.Output, tt.spec.output)
				}
				if r.Turn == 1 && r.Prompt.Tokens < tt.minPrompt {
					t.Fatalf("request %d: first-turn prompt %d tokens", r.ID, r.Prompt.Tokens)
				}
			}
			if tt.sharedSys && len(prefixes) != tt.maxPrefixK {
				t.Errorf("%d distinct prefix keys, want %d", len(prefixes), tt.maxPrefixK)
			}
			if !tt.sharedSys && len(prefixes) != st.sessions {
				t.Errorf("%d distinct prefix keys for %d sessions, want one each", len(prefixes), st.sessions)
			}
		})
	}
}

func TestAgenticContextGrowsPastEightK(t *testing.T) {
	w, err := New("agentic", Params{Seed: 5, Duration: 2 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	byTurn := map[int][]int{}
	for _, r := range drive(t, w, fixed(time.Second)) {
		byTurn[r.Turn] = append(byTurn[r.Turn], r.Prompt.Tokens)
	}
	first, tenth := mean(byTurn[1]), mean(byTurn[10])
	// system 2000-6000 + first message ~2000 (+ suffixes); each turn adds
	// ~288 output + ~900 message.
	if first < 5000 || first > 8000 {
		t.Errorf("mean first-turn prompt %.0f, want 5000..8000", first)
	}
	if tenth < 15000 || tenth < first+9*1000 {
		t.Errorf("mean tenth-turn prompt %.0f, want > 15000", tenth)
	}
}

func TestOpenWorkloadStatistics(t *testing.T) {
	const dur = 2 * time.Hour
	t.Run("oneshot", func(t *testing.T) {
		w, err := New("oneshot", Params{Seed: 2, Duration: dur})
		if err != nil {
			t.Fatal(err)
		}
		reqs := drive(t, w, fixed(time.Second))
		rate := float64(len(reqs)) / dur.Seconds()
		if want := oneshotSpec.defaultRate(DefaultReplicas); !within(rate, want, 0.02) {
			t.Errorf("arrival rate %.3f/s, want %.3f/s", rate, want)
		}
		prompts, outputs := make([]int, len(reqs)), make([]int, len(reqs))
		scenarios := map[string]bool{}
		for i, r := range reqs {
			prompts[i], outputs[i] = r.Prompt.Tokens, r.Output
			scenarios[r.Profile.PrefixKey] = true
			if r.Session != "" || r.Profile.SessionKey != "" || r.Turn != 1 {
				t.Fatalf("one-shot request %d has session %q/%q turn %d", r.ID, r.Session, r.Profile.SessionKey, r.Turn)
			}
		}
		if got := mean(prompts); !within(got, 2250, 0.01) {
			t.Errorf("mean prompt %.0f, want 2250", got)
		}
		if got := mean(outputs); !within(got, 176, 0.02) {
			t.Errorf("mean output %.0f, want 176", got)
		}
		if len(scenarios) != 6 {
			t.Errorf("%d scenarios, want 6", len(scenarios))
		}
	})
	t.Run("longshort", func(t *testing.T) {
		w, err := New("longshort", Params{Seed: 2, Duration: dur})
		if err != nil {
			t.Fatal(err)
		}
		reqs := drive(t, w, fixed(time.Second))
		rate := float64(len(reqs)) / dur.Seconds()
		if want := longshortSpec.defaultRate(DefaultReplicas); !within(rate, want, 0.02) {
			t.Errorf("arrival rate %.3f/s, want %.3f/s", rate, want)
		}
		var long, short []int
		for _, r := range reqs {
			switch {
			case r.Prompt.Tokens >= 90000 && r.Output == 128:
				long = append(long, r.Prompt.Tokens)
			case r.Prompt.Tokens <= 2560 && r.Output == 64:
				short = append(short, r.Prompt.Tokens)
			default:
				t.Fatalf("request %d: prompt %d output %d fits neither class", r.ID, r.Prompt.Tokens, r.Output)
			}
			if r.Profile.PrefixKey != "" || r.Profile.SessionKey != "" {
				t.Fatalf("request %d carries keys %q/%q", r.ID, r.Profile.SessionKey, r.Profile.PrefixKey)
			}
		}
		share := float64(len(long)) / float64(len(reqs))
		if math.Abs(share-0.02) > 0.003 {
			t.Errorf("long share %.4f, want 0.02", share)
		}
		if got := mean(long); !within(got, 100000, 0.01) {
			t.Errorf("mean long prompt %.0f, want 100000", got)
		}
		if got := mean(short); !within(got, 2048, 0.01) {
			t.Errorf("mean short prompt %.0f, want 2048", got)
		}
	})
}

func TestMixedBlendsItsParts(t *testing.T) {
	const dur = 4 * time.Hour
	w, err := New("mixed", Params{Seed: 9, Duration: dur})
	if err != nil {
		t.Fatal(err)
	}
	reqs := drive(t, w, fixed(2*time.Second))
	// Arrivals of sessions (by their first request) and one-shot requests.
	got := map[string]int{}
	seen := map[string]bool{}
	ids := map[uint64]bool{}
	for _, r := range reqs {
		if ids[r.ID] {
			t.Fatalf("request id %d used twice", r.ID)
		}
		ids[r.ID] = true
		switch {
		case strings.HasPrefix(r.Session, "agentic-"), strings.HasPrefix(r.Session, "chat-"):
			if !seen[r.Session] {
				seen[r.Session] = true
				got[strings.SplitN(r.Session, "-", 2)[0]]++
			}
		case r.Profile.PrefixKey != "":
			got["oneshot"]++
		default:
			got["longshort"]++
		}
	}
	for _, m := range mixedShares {
		want := m.share * defaultRateOf(m.name, DefaultReplicas) * dur.Seconds()
		if !within(float64(got[m.name]), want, 0.08) {
			t.Errorf("%s: %d arrivals, want %.0f", m.name, got[m.name], want)
		}
	}
	// A Rate scales every part alike.
	w2, err := New("mixed", Params{Seed: 9, Duration: dur / 4, Rate: 2 * totalMixedRate(DefaultReplicas)})
	if err != nil {
		t.Fatal(err)
	}
	n2 := 0
	for _, r := range drive(t, w2, fixed(2*time.Second)) {
		if r.Session == "" {
			n2++
		}
	}
	if want := float64(got["oneshot"]+got["longshort"]) / 2; !within(float64(n2), want, 0.08) {
		t.Errorf("doubled rate over a quarter of the time: %d one-shot arrivals, want ~%.0f", n2, want)
	}
}

func totalMixedRate(replicas int) float64 {
	s := 0.0
	for _, m := range mixedShares {
		s += m.share * defaultRateOf(m.name, replicas)
	}
	return s
}

func TestDefaultRateScalesWithReplicas(t *testing.T) {
	for _, name := range []string{"agentic", "chat", "oneshot", "longshort"} {
		r4, r32 := defaultRateOf(name, 4), defaultRateOf(name, 32)
		if !within(r32, 8*r4, 1e-9) || r4 <= 0 {
			t.Errorf("%s: default rate %v at 4 replicas, %v at 32", name, r4, r32)
		}
	}
}
