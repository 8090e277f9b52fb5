package discovery

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"
)

// Resolver is the part of *net.Resolver the DNS source uses (tests inject a fake).
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// DNS discovers replicas from the A/AAAA or SRV records of a headless
// service, resolved again every interval.
type DNS struct {
	cfg      DNSConfig
	resolver Resolver
	log      *slog.Logger
}

// NewDNS returns a DNS source for cfg using resolver.
func NewDNS(cfg DNSConfig, resolver Resolver, logger *slog.Logger) *DNS {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &DNS{cfg: cfg, resolver: resolver, log: logger}
}

// Resolve returns the current set: one target per address (A/AAAA, at
// cfg.Port) or per SRV record (its own target and port), sorted by name.
func (d *DNS) Resolve(ctx context.Context) ([]Target, error) {
	var out []Target
	switch d.cfg.Record {
	case "srv":
		// The whole record name is given: _http._tcp.vllm.ns.svc... (the
		// service and proto are empty so LookupSRV looks it up as is).
		_, srvs, err := d.resolver.LookupSRV(ctx, "", "", d.cfg.Name)
		if err != nil {
			return nil, fmt.Errorf("discovery: dns: SRV %s: %w", d.cfg.Name, err)
		}
		for _, s := range srvs {
			host := strings.TrimSuffix(s.Target, ".")
			if host == "" || s.Port == 0 {
				continue
			}
			port := int(s.Port)
			out = append(out, Target{Name: targetName("", host, port), URL: targetURL(d.cfg.Scheme, host, port), Models: d.cfg.Models})
		}
	default:
		addrs, err := d.resolver.LookupIPAddr(ctx, d.cfg.Name)
		if err != nil {
			return nil, fmt.Errorf("discovery: dns: %s: %w", d.cfg.Name, err)
		}
		for _, a := range addrs {
			host := a.IP.String()
			out = append(out, Target{Name: targetName("", host, d.cfg.Port), URL: targetURL(d.cfg.Scheme, host, d.cfg.Port), Models: d.cfg.Models})
		}
	}
	slices.SortFunc(out, func(a, b Target) int { return strings.Compare(a.Name, b.Name) })
	out = slices.CompactFunc(out, func(a, b Target) bool { return a.Name == b.Name })
	return out, nil
}

// Run resolves at once and then every interval. A failed resolution
// keeps the last set (a DNS hiccup must not empty the fleet) and is logged.
func (d *DNS) Run(ctx context.Context, update func([]Target)) error {
	interval := d.cfg.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	resolve := func(ctx context.Context) ([]Target, error) {
		rctx, cancel := context.WithTimeout(ctx, min(interval, 10*time.Second))
		defer cancel()
		return d.Resolve(rctx)
	}
	return pollEvery(ctx, interval, resolve, update, func(err error) {
		d.log.Warn("discovery: dns resolution failed; keeping the last set", slog.String("error", err.Error()))
	})
}
