package policy

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Names of the policies this package registers.
const (
	NameRR           = "rr"
	NameLeastRequest = "least-request"
	NameSticky       = "sticky"
	NamePrefixTree   = "prefix-tree"
	NameLLMLB        = "llmlb"
	NameLLMLBWarm    = "llmlb-warm"
)

// DefaultName is the policy used when none is named: cost, which met the
// benchmark's bar against every other policy (BENCHMARKS.md).
const DefaultName = NameCost

// Reasons a policy gives for the X-LLMLB-Route header.
const (
	ReasonAffinity = "affinity"
	ReasonLoad     = "load"
)

// Factory is how a registered policy is built and configured.
type Factory struct {
	// New builds a fresh instance with its own state from s (it reads its
	// own section only).
	New func(s Settings) (Policy, error)
	// Section returns the policy's own part of s, the routing.<policy>.*
	// keys of the configuration, for parameters set by name
	// (name:key=value on the command line); nil when it has none.
	Section func(s *Settings) Section
	// PollEvery is how often a policy whose original reads the replicas'
	// metrics on its own schedule polls them (llm-d: refresh_interval); the
	// benchmark scrapes its runs that often. nil: at every scrape.
	PollEvery func(s Settings) time.Duration
	// PromptBlocks: the policy matches prompts by their blocks' hashes,
	// which the request parser computes only when asked.
	PromptBlocks bool
	// Aliases are the names other routers give the same policy (SGLang's
	// and vLLM's "cache_aware" for prefix-tree), accepted by --policy.
	// Only exact equivalents are aliases.
	Aliases []string
}

// Section is one policy's settings: plain data whose Validate names the bad
// key relative to the routing section (e.g. "cost.bounded_load: ...").
type Section interface {
	Validate() error
}

// registry holds the registered policies in registration order.
var registry struct {
	sync.RWMutex
	names     []string
	factories map[string]Factory
	aliases   map[string]string
}

// Register makes a policy available by name to the core, the configuration
// (routing.policy) and the commands (--policy, bench's --policies). It
// panics on an empty or duplicate name or a nil New: registration happens
// at init, where that is a programming error.
func Register(name string, f Factory) {
	registry.Lock()
	defer registry.Unlock()
	if name == "" || f.New == nil {
		panic("policy: Register needs a name and a New")
	}
	if _, dup := registry.factories[name]; dup {
		panic("policy: " + name + " registered twice")
	}
	if registry.factories == nil {
		registry.factories = make(map[string]Factory)
	}
	for _, a := range f.Aliases {
		if _, dup := registry.aliases[a]; dup {
			panic("policy: alias " + a + " registered twice")
		}
		if registry.aliases == nil {
			registry.aliases = make(map[string]string)
		}
		registry.aliases[a] = name
	}
	registry.names = append(registry.names, name)
	registry.factories[name] = f
}

// Resolve returns the registered name an alias stands for (case and
// surrounding spaces ignored), or name unchanged when it is no alias.
func Resolve(name string) string {
	registry.RLock()
	defer registry.RUnlock()
	if p, ok := registry.aliases[strings.ToLower(strings.TrimSpace(name))]; ok {
		return p
	}
	return name
}

// Lookup returns the named policy's factory.
func Lookup(name string) (Factory, bool) {
	registry.RLock()
	defer registry.RUnlock()
	f, ok := registry.factories[name]
	return f, ok
}

// Names lists the registered policies in the benchmark's order: the
// baselines (rr, least-request, sticky, prefix-tree), llm-d's scheduler,
// the pin policies llmlb and llmlb-warm, cost, then any registered later.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	return slices.Clone(registry.names)
}

// ErrUnknown formats the error for a policy name nobody registered.
func ErrUnknown(name string) error {
	names := Names()
	known := names[len(names)-1]
	if len(names) > 1 {
		known = strings.Join(names[:len(names)-1], ", ") + " or " + known
	}
	return fmt.Errorf("policy: unknown policy %q (want %s)", name, known)
}

// New builds a fresh policy with its default settings. Each call returns a
// new instance with its own state.
func New(name string) (Policy, error) {
	return NewWithSettings(name, DefaultSettings())
}

// NewWithSettings builds a fresh policy with the given settings (only the
// named policy's part is read).
func NewWithSettings(name string, s Settings) (Policy, error) {
	f, ok := Lookup(name)
	if !ok {
		return nil, ErrUnknown(name)
	}
	return f.New(s)
}

func init() {
	Register(NameRR, Factory{
		New:     func(Settings) (Policy, error) { return NewRoundRobin(), nil },
		Aliases: []string{"round_robin", "round-robin", "roundrobin"},
	})
	// The router's own in-flight requests, lowest first (least connections).
	Register(NameLeastRequest, Factory{
		New:     func(Settings) (Policy, error) { return NewLeastRequest(), nil },
		Aliases: []string{"least_request", "least_requests", "least_connections", "least_conn"},
	})
	// Rendezvous hashing of the session key: a consistent hash (a key moves
	// only when its replica leaves), with no load awareness.
	Register(NameSticky, Factory{
		New:     func(Settings) (Policy, error) { return NewSticky(), nil },
		Aliases: []string{"consistent_hash", "consistent-hash"},
	})
	// SGLang router / vLLM router "cache_aware": longest prefix match within
	// load bounds, which is what prefix-tree reproduces with their defaults.
	Register(NamePrefixTree, Factory{
		New:          func(s Settings) (Policy, error) { return NewPrefixTree(s.PrefixTree) },
		Section:      func(s *Settings) Section { return &s.PrefixTree },
		PromptBlocks: true,
		Aliases:      []string{"cache_aware", "cache-aware"},
	})
	Register(NameLLMD, Factory{
		New:          func(s Settings) (Policy, error) { return NewLLMD(s.LLMD) },
		Section:      func(s *Settings) Section { return &s.LLMD },
		PollEvery:    func(s Settings) time.Duration { return s.LLMD.RefreshInterval },
		PromptBlocks: true,
	})
	Register(NameLLMLB, Factory{
		New:     func(s Settings) (Policy, error) { return NewLLMLB(s.Affinity, false), nil },
		Section: func(s *Settings) Section { return &s.Affinity },
	})
	Register(NameLLMLBWarm, Factory{
		New:     func(s Settings) (Policy, error) { return NewLLMLB(s.Affinity, true), nil },
		Section: func(s *Settings) Section { return &s.Affinity },
	})
	Register(NameCost, Factory{
		New:          func(s Settings) (Policy, error) { return NewCost(s.Cost) },
		Section:      func(s *Settings) Section { return &s.Cost },
		PromptBlocks: true,
	})
}
