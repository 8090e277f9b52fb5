package discovery

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// fakeResolver answers from fields the test changes between resolutions.
type fakeResolver struct {
	mu   sync.Mutex
	ips  []string
	srvs []*net.SRV
	err  error
	asks int
}

func (r *fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asks++
	if r.err != nil {
		return nil, r.err
	}
	var out []net.IPAddr
	for _, s := range r.ips {
		out = append(out, net.IPAddr{IP: net.ParseIP(s)})
	}
	return out, nil
}

func (r *fakeResolver) LookupSRV(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asks++
	if service != "" || proto != "" {
		return "", nil, errors.New("want the full record name")
	}
	return "", r.srvs, r.err
}

func (r *fakeResolver) set(ips []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ips, r.err = ips, err
}

func TestDNSResolve(t *testing.T) {
	cases := []struct {
		name string
		cfg  DNSConfig
		res  *fakeResolver
		want []Target
	}{
		{
			name: "A and AAAA records at the configured port",
			cfg:  DNSConfig{Name: "vllm.ns.svc", Record: "a", Port: 8000, Scheme: "http", Models: []string{"m"}},
			res:  &fakeResolver{ips: []string{"10.0.0.2", "10.0.0.1", "fd00::1", "10.0.0.1"}},
			want: []Target{
				{Name: "10.0.0.1:8000", URL: "http://10.0.0.1:8000", Models: []string{"m"}},
				{Name: "10.0.0.2:8000", URL: "http://10.0.0.2:8000", Models: []string{"m"}},
				{Name: "[fd00::1]:8000", URL: "http://[fd00::1]:8000", Models: []string{"m"}},
			},
		},
		{
			name: "SRV records carry host and port",
			cfg:  DNSConfig{Name: "_http._tcp.vllm.ns.svc", Record: "srv", Scheme: "https"},
			res: &fakeResolver{srvs: []*net.SRV{
				{Target: "vllm-1.vllm.ns.svc.", Port: 8001},
				{Target: "vllm-0.vllm.ns.svc.", Port: 8000},
				{Target: "", Port: 8000}, // malformed: skipped
			}},
			want: []Target{
				{Name: "vllm-0.vllm.ns.svc:8000", URL: "https://vllm-0.vllm.ns.svc:8000"},
				{Name: "vllm-1.vllm.ns.svc:8001", URL: "https://vllm-1.vllm.ns.svc:8001"},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := NewDNS(c.cfg, c.res, nil).Resolve(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(c.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestDNSRunReresolves: the source re-resolves on its interval, reports
// changes, and keeps the last set through a failed resolution.
func TestDNSRunReresolves(t *testing.T) {
	res := &fakeResolver{ips: []string{"10.0.0.1", "10.0.0.2"}}
	src := NewDNS(DNSConfig{Name: "vllm", Record: "a", Port: 8000, Scheme: "http", Interval: time.Millisecond}, res, nil)
	sets := make(chan []Target)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.Run(ctx, func(ts []Target) {
		select {
		case sets <- ts:
		case <-ctx.Done():
		}
	})
	names := func(ts []Target) []string {
		var out []string
		for _, t := range ts {
			out = append(out, t.Name)
		}
		return out
	}
	if got := names(<-sets); !cmp.Equal(got, []string{"10.0.0.1:8000", "10.0.0.2:8000"}) {
		t.Fatalf("first set %v", got)
	}
	res.set(nil, errors.New("SERVFAIL"))
	// While resolution fails no set is reported; wait until it has failed
	// a few times, then fix it with one replica fewer.
	for {
		res.mu.Lock()
		n := res.asks
		res.mu.Unlock()
		if n >= 4 {
			break
		}
		select {
		case ts := <-sets:
			if len(ts) != 2 {
				t.Fatalf("a set reported during the failure: %v", names(ts))
			}
		default:
			time.Sleep(time.Millisecond)
		}
	}
	res.set([]string{"10.0.0.2"}, nil)
	for {
		if got := names(<-sets); cmp.Equal(got, []string{"10.0.0.2:8000"}) {
			break
		} else if len(got) != 2 {
			t.Fatalf("unexpected set %v", got)
		}
	}
}
