package config

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// hostsResolver resolves from a fixed table and reports fixed local
// addresses (this machine's interfaces).
type hostsResolver struct {
	hosts map[string][]string
	local []netip.Addr
}

func (h hostsResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := h.hosts[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func (h hostsResolver) LocalAddrs() []netip.Addr { return h.local }

// TestValidateRefusesSelfByName: a replica URL whose host name resolves
// to one of llmlb's own listeners is refused by validate as the address
// itself is, for a listener on all interfaces (any address of this
// machine) or on one address (that address only); another machine on the
// same port, or a name that does not resolve, is accepted.
func TestValidateRefusesSelfByName(t *testing.T) {
	saved := selfResolver
	t.Cleanup(func() { selfResolver = saved })
	selfResolver = hostsResolver{
		hosts: map[string][]string{
			"llmlb.internal": {"10.0.0.7"},             // this machine
			"llmlb-v6":       {"fd00::7"},              // this machine, IPv6
			"mapped":         {"::ffff:10.0.0.7"},      // this machine, IPv4-mapped
			"gpu-1":          {"10.0.0.9"},             // another machine
			"two-faced":      {"10.0.0.9", "10.0.0.7"}, // one of its addresses is this machine's
		},
		local: []netip.Addr{netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("fd00::7"), netip.MustParseAddr("127.0.0.1")},
	}
	refused := func(i int, url, listener string) string {
		return `config: replicas[` + string(rune('0'+i)) + `].url: "` + url + `" is llmlb's own listener "` + listener + `": every request sent there would come back to llmlb`
	}
	tests := []struct {
		name   string
		listen string
		url    string
		want   []string
	}{
		{"name of this machine, all interfaces", ":8080", "http://llmlb.internal:8080", []string{refused(0, "http://llmlb.internal:8080", ":8080")}},
		{"IPv6 name, all interfaces", "[::]:8080", "http://llmlb-v6:8080", []string{refused(0, "http://llmlb-v6:8080", "[::]:8080")}},
		{"IPv4-mapped answer", "0.0.0.0:8080", "http://mapped:8080", []string{refused(0, "http://mapped:8080", "0.0.0.0:8080")}},
		{"one of several answers", ":8080", "http://two-faced:8080", []string{refused(0, "http://two-faced:8080", ":8080")}},
		{"default port", ":80", "http://llmlb.internal", []string{refused(0, "http://llmlb.internal", ":80")}},
		{"name of the bound address", "10.0.0.7:8080", "http://llmlb.internal:8080", []string{refused(0, "http://llmlb.internal:8080", "10.0.0.7:8080")}},
		{"another address of this machine", "127.0.0.1:8080", "http://llmlb.internal:8080", nil},
		{"another machine, same port", ":8080", "http://gpu-1:8080", nil},
		{"another port", ":8080", "http://llmlb.internal:8000", nil},
		{"a name that does not resolve", ":8080", "http://nowhere:8080", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Default()
			c.Listen = tc.listen
			c.Replicas = []Replica{{Name: "r", URL: tc.url}}
			if d := cmp.Diff(tc.want, messages(c.Validate())); d != "" {
				t.Errorf("Validate mismatch (-want +got):\n%s", d)
			}
		})
	}
}
