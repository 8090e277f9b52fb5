package simreplica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
)

// FleetOptions configure StartFleet. Zero values take the defaults noted.
type FleetOptions struct {
	Replicas int    // default 1
	Profile  string // default engine.DefaultProfile
	Model    string // default "sim-model"
	// Listen is the first replica's address; the others take the following
	// ports. With port 0 (the default "127.0.0.1:0") each replica gets its own
	// free port.
	Listen string
	// ControlOffset, when > 0, gives each replica a control listener on its
	// port + ControlOffset (llmlb sim uses 1000). With Listen port 0 the
	// control listeners get free ports too.
	ControlOffset int
	LegacyMetrics bool
	Fault         Fault  // initial fault of every replica
	NamePrefix    string // replica names are NamePrefix+"1".."N"; default "sim-"
	// Seed seeds the replicas' error-rate draws (replica i uses Seed+i); 0 = random.
	Seed   uint64
	Logger *slog.Logger
	// MaxNumSeqs and KVCacheTokens override every replica's profile when > 0.
	MaxNumSeqs, KVCacheTokens int
	// MaxPartialPrefills overrides every replica's prefill model when > 0
	// (1 serial, more parallel: engine.Profile.MaxPartialPrefills).
	MaxPartialPrefills int
	// PriorityScheduling: every replica schedules by priority
	// (Options.PriorityScheduling).
	PriorityScheduling bool
	// Tokenizer: every replica tokenizes with the model's own tokenizer,
	// each from its own random seed (Options.Tokenizer).
	Tokenizer Tokenizer
}

// Fleet is a set of replicas running in process, for tests and the demo.
type Fleet struct {
	// Replicas in port order. Each has Name, URL and SetFault/Fault.
	Replicas []*Replica

	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	errs   []error
}

// StartFleet binds and runs opts.Replicas replicas until ctx is cancelled or
// Close is called. On error nothing is left running.
func StartFleet(ctx context.Context, opts FleetOptions) (*Fleet, error) {
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.NamePrefix == "" {
		opts.NamePrefix = "sim-"
	}
	host, portStr, err := net.SplitHostPort(opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("simreplica: listen address %q: %w", opts.Listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port+opts.Replicas-1 > 65535 {
		return nil, fmt.Errorf("simreplica: listen address %q: bad port for %d replicas", opts.Listen, opts.Replicas)
	}
	if opts.ControlOffset < 0 || (port > 0 && opts.ControlOffset > 0 && port+opts.Replicas-1+opts.ControlOffset > 65535) {
		return nil, fmt.Errorf("simreplica: control offset %d gives ports above 65535", opts.ControlOffset)
	}
	replicas := make([]*Replica, 0, opts.Replicas)
	for i := range opts.Replicas {
		addr, ctrl := net.JoinHostPort(host, "0"), ""
		if port > 0 {
			addr = net.JoinHostPort(host, strconv.Itoa(port+i))
		}
		if opts.ControlOffset > 0 {
			ctrl = net.JoinHostPort(host, "0")
			if port > 0 {
				ctrl = net.JoinHostPort(host, strconv.Itoa(port+i+opts.ControlOffset))
			}
		}
		seed := opts.Seed
		if seed != 0 {
			seed += uint64(i)
		}
		r, err := New(Options{
			Name:          opts.NamePrefix + strconv.Itoa(i+1),
			Model:         opts.Model,
			Profile:       opts.Profile,
			Listen:        addr,
			ControlListen: ctrl,
			LegacyMetrics: opts.LegacyMetrics,
			Fault:         opts.Fault,
			Seed:          seed,
			Logger:        opts.Logger,
			MaxNumSeqs:    opts.MaxNumSeqs,
			KVCacheTokens: opts.KVCacheTokens,
			// Parallel prefill, when asked for.
			MaxPartialPrefills: opts.MaxPartialPrefills,
			PriorityScheduling: opts.PriorityScheduling,
			Tokenizer:          opts.Tokenizer,
		})
		if err != nil {
			for _, r := range replicas {
				r.release()
			}
			return nil, err
		}
		replicas = append(replicas, r)
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Fleet{Replicas: replicas, cancel: cancel}
	for _, r := range replicas {
		f.wg.Go(func() {
			if err := r.Run(ctx); err != nil {
				f.mu.Lock()
				f.errs = append(f.errs, fmt.Errorf("%s: %w", r.Name(), err))
				f.mu.Unlock()
			}
		})
	}
	return f, nil
}

// URLs returns the replicas' base URLs in order.
func (f *Fleet) URLs() []string {
	urls := make([]string, len(f.Replicas))
	for i, r := range f.Replicas {
		urls[i] = r.URL()
	}
	return urls
}

// Replica returns the replica with the given name, or nil.
func (f *Fleet) Replica(name string) *Replica {
	for _, r := range f.Replicas {
		if r.Name() == name {
			return r
		}
	}
	return nil
}

// Close stops every replica and waits for them; it returns Wait's error.
func (f *Fleet) Close() error {
	f.cancel()
	return f.Wait()
}

// Wait blocks until every replica has stopped (after ctx is cancelled or
// Close) and returns their errors joined.
func (f *Fleet) Wait() error {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return errors.Join(f.errs...)
}

// release frees the listeners of a replica whose Run was never called.
func (r *Replica) release() {
	r.gate.Close()
	if r.control != nil {
		r.control.Close()
	}
}
