package main

import (
	"fmt"
	"strings"

	"github.com/llmlb/llmlb/internal/policy"
)

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
	if p := policy.Resolve(name); p != name {
		return p, nil
	}
	key := strings.ToLower(strings.TrimSpace(name))
	if nearest, ok := notEquivalent[key]; ok {
		return "", fmt.Errorf("--policy %s: llmlb has no equivalent policy; the nearest is %s", name, nearest)
	}
	return name, nil
}
