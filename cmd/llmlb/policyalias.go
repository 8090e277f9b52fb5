package main

import (
	"fmt"
	"strings"
)

// policyAliases maps the names other routers give their policies to the
// llmlb policy that does the same thing (SPEC s13). Only exact equivalents
// are aliases; a name with no equivalent is refused with the nearest one.
var policyAliases = map[string]string{
	// SGLang router / vLLM router "cache_aware": longest prefix match within
	// load bounds, which is what prefix-tree reproduces with their defaults.
	"cache_aware": "prefix-tree",
	"cache-aware": "prefix-tree",
	"round_robin": "rr",
	"round-robin": "rr",
	"roundrobin":  "rr",
	// Rendezvous hashing of the session key: a consistent hash (a key moves
	// only when its replica leaves), with no load awareness.
	"consistent_hash": "sticky",
	"consistent-hash": "sticky",
	// The router's own in-flight requests, lowest first (least connections).
	"least_request":     "least-request",
	"least_requests":    "least-request",
	"least_connections": "least-request",
	"least_conn":        "least-request",
}

// notEquivalent names policies of other routers that llmlb does not have,
// with the nearest one and why it differs.
var notEquivalent = map[string]string{
	"power_of_two": "least-request (it compares every replica's in-flight requests; power-of-two samples two at random and takes the less loaded)",
	"power-of-two": "least-request (it compares every replica's in-flight requests; power-of-two samples two at random and takes the less loaded)",
	"random":       "rr (rotation; llmlb has no random policy)",
}

// resolvePolicy returns the llmlb policy name for a --policy value: an
// alias is translated, any other name is returned unchanged for the
// configuration's validation to check.
func resolvePolicy(name string) (string, error) {
	key := strings.ToLower(strings.TrimSpace(name))
	if p, ok := policyAliases[key]; ok {
		return p, nil
	}
	if nearest, ok := notEquivalent[key]; ok {
		return "", fmt.Errorf("--policy %s: llmlb has no equivalent policy; the nearest is %s", name, nearest)
	}
	return name, nil
}
