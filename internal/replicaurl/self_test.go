package replicaurl

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

type fixedResolver struct {
	hosts map[string][]string
	local []netip.Addr
}

func (f fixedResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := f.hosts[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func (f fixedResolver) LocalAddrs() []netip.Addr { return f.local }

// A replica URL that is llmlb's own listener made every request loop.
func TestPointsAt(t *testing.T) {
	r := fixedResolver{
		hosts: map[string][]string{"me.internal": {"10.0.0.7"}, "gpu1": {"10.0.0.9"}},
		local: []netip.Addr{netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("127.0.0.1")},
	}
	listeners := []string{":8080", "127.0.0.1:9090"}
	tests := []struct {
		url  string
		want bool
	}{
		{"http://127.0.0.1:8080", true},
		{"http://localhost:8080", true},
		{"http://[::1]:8080", true},
		{"http://me.internal:8080", true}, // a name for one of this machine's addresses
		{"http://10.0.0.7:8080/", true},
		{"http://127.0.0.1:9090", true}, // the admin listener
		{"http://gpu1:8080", false},     // same port, another machine
		{"http://127.0.0.1:8000", false},
		{"http://10.0.0.7:9090", false}, // admin binds loopback only
		{"http://unknown-host:8080", false},
		{"https://127.0.0.1", false},
	}
	for _, tc := range tests {
		if _, got := PointsAt(tc.url, listeners, r); got != tc.want {
			t.Errorf("PointsAt(%q) = %v, want %v", tc.url, got, tc.want)
		}
	}
	if _, got := PointsAt("http://127.0.0.1:80", []string{"0.0.0.0:80"}, r); !got {
		t.Error("default port against 0.0.0.0:80: want true")
	}
}
