package policy_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/balancer"
	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/policy"
)

// lastName is a policy written outside package policy's own files, the way a
// contributor adds one: it picks the candidate whose name sorts last and
// counts the requests that finished on each replica. It needs only Choose,
// the hooks it uses and a Register call.
type lastName struct {
	policy.Base
	mu       sync.Mutex
	finished map[string]int
}

func (*lastName) Name() string { return "toy-last-name" }

func (*lastName) Choose(_ *policy.Request, cands []policy.Candidate, _ time.Time) policy.Choice {
	best := 0
	for i, c := range cands {
		if c.Name > cands[best].Name {
			best = i
		}
	}
	return policy.Choice{Index: best, Reason: policy.ReasonLoad, Detail: "last name"}
}

func (l *lastName) Finished(replica string, _ []uint64, _ time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finished[replica]++
}

var (
	registerToy sync.Once
	toy         *lastName // the instance the balancer built last
)

func registerLastName() {
	registerToy.Do(func() {
		policy.Register("toy-last-name", policy.Factory{New: func(policy.Settings) (policy.Policy, error) {
			toy = &lastName{finished: map[string]int{}}
			return toy, nil
		}})
	})
}

// TestRegisteredPolicyRoutes: a policy registered by name is known to the
// configuration and the routing core with no change outside its own code,
// makes the choices, and hears how its requests fared.
func TestRegisteredPolicyRoutes(t *testing.T) {
	registerLastName()
	if !strings.Contains(strings.Join(policy.Names(), ","), "toy-last-name") {
		t.Fatalf("Names() = %v, want toy-last-name listed", policy.Names())
	}

	cfg, err := config.Parse([]byte("routing:\n  policy: toy-last-name\nreplicas:\n  - url: http://a:8000\n"), "toy.yaml")
	if err != nil {
		t.Fatalf("the configuration refuses a registered policy: %v", err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("the configuration refuses a registered policy: %v", err)
	}
	if cfg.Routing.Policy != "toy-last-name" {
		t.Fatalf("routing.policy = %q", cfg.Routing.Policy)
	}

	b, err := balancer.New(cfg.Routing)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, name := range []string{"a", "c", "b"} {
		if err := b.AddReplica(balancer.ReplicaSpec{Name: name, URL: "http://" + name}, now); err != nil {
			t.Fatal(err)
		}
		b.ObserveScrape(name, balancer.Snapshot{}, nil, now)
	}
	for range 3 {
		res, err := b.Select(&balancer.Profile{Model: "m", PromptTokens: 32, PromptBlocks: []uint64{1, 2}}, now)
		if err != nil {
			t.Fatal(err)
		}
		if res.Replica != "c" || res.Explanation.Policy != "toy-last-name" {
			t.Fatalf("routed to %s by %q, want c by toy-last-name", res.Replica, res.Explanation.Policy)
		}
		b.Release(res, balancer.OutcomeOK, now)
	}
	toy.mu.Lock()
	defer toy.mu.Unlock()
	if toy.finished["c"] != 3 {
		t.Errorf("Finished heard %v, want 3 requests on c", toy.finished)
	}

	typo, err := config.Parse([]byte("routing:\n  policy: toy-lastname\nreplicas:\n  - url: http://a:8000\n"), "typo.yaml")
	if err == nil {
		err = typo.Validate()
	}
	if err == nil || !strings.Contains(err.Error(), "toy-last-name") {
		t.Errorf("a misspelt policy: %v, want an error listing toy-last-name", err)
	}
}
