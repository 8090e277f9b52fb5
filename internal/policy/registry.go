package policy

import (
	"fmt"
	"strings"
)

// Policy names accepted by New (SPEC s12). The llmlb five-step pipeline is
// built by package balancer, not here.
const (
	NameRR           = "rr"
	NameLeastRequest = "least-request"
	NameSticky       = "sticky"
	NamePrefixTree   = "prefix-tree"
)

// Reasons a baseline gives for the X-LLMLB-Route header.
const (
	ReasonAffinity = "affinity"
	ReasonLoad     = "load"
)

// Names lists the policies New builds: the baselines in the order of SPEC
// s12, llm-d's scheduler, then cost.
func Names() []string {
	return []string{NameRR, NameLeastRequest, NameSticky, NamePrefixTree, NameLLMD, NameCost}
}

// New builds a fresh policy with its default settings. Each call returns a
// new instance with its own state.
func New(name string) (Policy, error) {
	return NewWithSettings(name, DefaultSettings())
}

// NewWithSettings builds a fresh policy with the given settings (only the
// named policy's part is read).
func NewWithSettings(name string, s Settings) (Policy, error) {
	switch name {
	case NamePrefixTree:
		return NewPrefixTree(s.PrefixTree)
	case NameCost:
		return NewCost(s.Cost)
	case NameLLMD:
		return NewLLMD(s.LLMD)
	case NameRR:
		return NewRoundRobin(), nil
	case NameLeastRequest:
		return NewLeastRequest(), nil
	case NameSticky:
		return NewSticky(), nil
	}
	return nil, fmt.Errorf("policy: unknown policy %q (known: %s)", name, strings.Join(Names(), ", "))
}
