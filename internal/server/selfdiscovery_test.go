package server

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/discovery"
	"github.com/llmlb/llmlb/internal/simreplica"
)

// A discovered endpoint that is llmlb's own listener (a Service selecting
// llmlb's pods, a DNS name for this machine) would send every request back
// to llmlb. Discovery refuses it, by address or by a name that resolves to
// it, whichever listener it names, logs why, and adds the others of the
// same set.
func TestDiscoveryRefusesItsOwnListeners(t *testing.T) {
	fleet, err := simreplica.StartFleet(context.Background(), simreplica.FleetOptions{Replicas: 1, Model: model, Seed: 1, Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fleet.Close() })
	ok := discovery.Target{Name: "disc-ok", URL: fleet.URLs()[0]}
	src := &testSource{first: []discovery.Target{ok}, sets: make(chan []discovery.Target)}
	logs := &syncBuffer{}
	e := startURLs(t, fleet.URLs(), slog.New(slog.NewTextHandler(logs, nil)), func(c *config.Config) {
		c.Replicas = nil // every replica is discovered
	}, WithDiscovery(src))

	// The same port as a name that resolves to this machine.
	proxyURL, _ := url.Parse(e.proxy)
	byName := "http://localhost:" + proxyURL.Port()
	targets := []discovery.Target{
		ok,
		{Name: "self-proxy", URL: e.proxy},
		{Name: "self-proxy-by-name", URL: byName},
		{Name: "self-admin", URL: e.admin},
	}
	src.sets <- targets

	refused := []string{"self-admin", "self-proxy", "self-proxy-by-name"}
	deadline := time.Now().Add(waitFor)
	for !allLogged(logs.String(), refused) {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged for each of %v; logs:\n%s", refused, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, r := range e.replicas() {
		if strings.HasPrefix(r.Name, "self") {
			t.Errorf("discovered %s (%s) was added", r.Name, r.URL)
		}
	}
	if got := e.srv.Syncer().Managed(); len(got) != 1 || got[0] != "disc-ok" {
		t.Errorf("managed replicas %v, want [disc-ok]", got)
	}
}

// allLogged reports whether logs has a WARN refusal naming each replica.
func allLogged(logs string, replicas []string) bool {
	for _, name := range replicas {
		found := false
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "discovery: replica failed") &&
				strings.Contains(line, "replica="+name+" ") && strings.Contains(line, "llmlb's own listener") {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
