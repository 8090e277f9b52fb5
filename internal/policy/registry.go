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

// Names lists the baseline policies New builds, in the order of SPEC s12.
func Names() []string {
	return []string{NameRR, NameLeastRequest, NameSticky, NamePrefixTree}
}

// New builds a fresh baseline policy with its default settings. Each call
// returns a new instance with its own state.
func New(name string) (Policy, error) {
	switch name {
	case NameRR:
		return NewRoundRobin(), nil
	case NameLeastRequest:
		return NewLeastRequest(), nil
	case NameSticky:
		return NewSticky(), nil
	case NamePrefixTree:
		return NewPrefixTree(DefaultPrefixTreeConfig())
	}
	return nil, fmt.Errorf("policy: unknown policy %q (known: %s)", name, strings.Join(Names(), ", "))
}
