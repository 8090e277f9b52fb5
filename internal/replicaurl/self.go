package replicaurl

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Resolver finds the addresses a replica URL's host name stands for and
// the addresses of this machine. net's resolver and interfaces are
// LocalResolver; tests use a fixed one.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
	LocalAddrs() []netip.Addr
}

// LocalResolver resolves with net.DefaultResolver and lists this machine's
// interface addresses.
type LocalResolver struct{}

// LookupHost implements Resolver.
func (LocalResolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	return net.DefaultResolver.LookupHost(ctx, host)
}

// LocalAddrs implements Resolver.
func (LocalResolver) LocalAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}

// lookupTimeout bounds the name lookup of a replica URL's host.
const lookupTimeout = 2 * time.Second

// PointsAt reports whether the replica URL raw reaches one of listeners
// (llmlb's own host:port addresses): same port, and a host that resolves to
// the listener's address, or to any address of this machine when the
// listener binds all interfaces. Such a replica would send every request
// back to llmlb. The host is looked up only when its port is a listener's.
// It returns the listener matched.
func PointsAt(raw string, listeners []string, r Resolver) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", false
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	var ips []netip.Addr // of the replica's host, resolved once when needed
	resolved := false
	for _, l := range listeners {
		lh, lp, err := net.SplitHostPort(l)
		if err != nil || lp != port {
			continue
		}
		if !resolved {
			ips, resolved = resolve(u.Hostname(), r), true
		}
		lip, lerr := netip.ParseAddr(lh)
		all := lh == "" || (lerr == nil && lip.IsUnspecified())
		var local []netip.Addr
		if all {
			local = r.LocalAddrs()
		}
		for _, ip := range ips {
			switch {
			case all && (ip.IsLoopback() || ip.IsUnspecified() || slices.Contains(local, ip)):
				return l, true
			case lerr == nil && ip == lip.Unmap():
				return l, true
			case strings.EqualFold(lh, "localhost") && ip.IsLoopback():
				return l, true
			}
		}
	}
	return "", false
}

// resolve returns host's addresses: an IP literal as is, "localhost" as the
// loopback addresses, any other name through r (nothing when it fails).
func resolve(host string, r Resolver) []netip.Addr {
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{ip.Unmap()}
	}
	if strings.EqualFold(host, "localhost") {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	}
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	names, err := r.LookupHost(ctx, host)
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, n := range names {
		if ip, err := netip.ParseAddr(n); err == nil {
			out = append(out, ip.Unmap())
		}
	}
	return out
}
