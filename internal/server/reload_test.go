package server

import (
	"slices"
	"sort"
	"testing"

	"github.com/llmlb/llmlb/internal/config"
	"github.com/llmlb/llmlb/internal/scrape"
)

// TestReload walks a sequence of SIGHUP reloads: each step's replica list
// and the names it must add and remove (the e2e test checks that streams on
// a removed replica finish).
func TestReload(t *testing.T) {
	rep := func(name, url, key string) config.Replica { return config.Replica{Name: name, URL: url, APIKey: key} }
	srv, err := New(testConfig("http://10.0.0.1:8000", "http://10.0.0.2:8000"), nil, WithFetcher(scrape.NewFake()))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name             string
		list             []config.Replica
		added, removed   []string
		wantNames        []string
		wantKey, keyName string
	}{
		{"same list changes nothing",
			[]config.Replica{rep("sim-1", "http://10.0.0.1:8000", ""), rep("sim-2", "http://10.0.0.2:8000", "")},
			nil, nil, []string{"sim-1", "sim-2"}, "", ""},
		{"one removed, one added",
			[]config.Replica{rep("sim-2", "http://10.0.0.2:8000", ""), rep("sim-3", "http://10.0.0.3:8000", "")},
			[]string{"sim-3"}, []string{"sim-1"}, []string{"sim-2", "sim-3"}, "", ""},
		{"changed url or key replaces it",
			[]config.Replica{rep("sim-2", "http://10.0.0.9:8000", "k2"), rep("sim-3", "http://10.0.0.3:8000", "")},
			[]string{"sim-2"}, []string{"sim-2"}, []string{"sim-2", "sim-3"}, "k2", "sim-2"},
		{"unnamed replica takes host:port",
			[]config.Replica{rep("", "http://10.0.0.4:8000", "")},
			[]string{"10.0.0.4:8000"}, []string{"sim-2", "sim-3"}, []string{"10.0.0.4:8000"}, "", ""},
		{"empty list removes all",
			nil, nil, []string{"10.0.0.4:8000"}, nil, "", ""},
	}
	for _, st := range steps {
		added, removed, err := srv.Reload(st.list)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		sort.Strings(removed)
		if !slices.Equal(added, st.added) || !slices.Equal(removed, st.removed) {
			t.Errorf("%s: added %v removed %v, want %v and %v", st.name, added, removed, st.added, st.removed)
		}
		var names []string
		for _, r := range srv.Balancer().Replicas(srv.now()) {
			names = append(names, r.Name)
		}
		sort.Strings(names)
		if !slices.Equal(names, st.wantNames) {
			t.Errorf("%s: replicas %v, want %v", st.name, names, st.wantNames)
		}
		if st.keyName != "" && srv.apiKey(st.keyName) != st.wantKey {
			t.Errorf("%s: api key of %s not updated", st.name, st.keyName)
		}
	}
}
