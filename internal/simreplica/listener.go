package simreplica

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// gateListener is the net.Listener the replica's http.Server serves on. It can
// really close its socket (down: clients get ECONNREFUSED) and bind the same
// address again (up) without the server noticing: connections accepted by the
// current socket are handed to Accept through a channel, and Accept only fails
// once the gate itself is closed.
type gateListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{} // closed by Close

	mu      sync.Mutex
	inner   net.Listener  // nil while down
	stop    chan struct{} // closed when inner is closed
	serving bool          // start was called: up starts an accept loop
	closed  bool
	wg      sync.WaitGroup // accept loops
}

// listenGate binds address. The returned gate accepts nothing until start.
func listenGate(address string) (*gateListener, error) {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("simreplica: listen %s: %w", address, err)
	}
	return &gateListener{
		addr:  ln.Addr(),
		conns: make(chan net.Conn),
		done:  make(chan struct{}),
		inner: ln,
		stop:  make(chan struct{}),
	}, nil
}

// start begins accepting on the bound socket (if up). The replica's Run calls
// it; the accept loops it starts end when the socket is closed by down or Close.
func (g *gateListener) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.serving || g.closed {
		return
	}
	g.serving = true
	if g.inner != nil {
		g.acceptLocked()
	}
}

func (g *gateListener) acceptLocked() {
	ln, stop := g.inner, g.stop
	g.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
					continue
				}
				return // closed by down or Close
			}
			select {
			case g.conns <- c:
			case <-stop:
				c.Close()
				return
			case <-g.done:
				c.Close()
				return
			}
		}
	})
}

// isUp reports whether the socket is bound.
func (g *gateListener) isUp() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.inner != nil
}

// down closes the socket; new connections are refused by the kernel.
func (g *gateListener) down() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inner == nil {
		return
	}
	g.inner.Close()
	close(g.stop)
	g.inner = nil
}

// up binds the same address again.
func (g *gateListener) up() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.inner != nil || g.closed {
		return nil
	}
	ln, err := net.Listen("tcp", g.addr.String())
	if err != nil {
		return fmt.Errorf("simreplica: re-listen %s: %w", g.addr, err)
	}
	g.inner, g.stop = ln, make(chan struct{})
	if g.serving {
		g.acceptLocked()
	}
	return nil
}

// Accept implements net.Listener.
func (g *gateListener) Accept() (net.Conn, error) {
	select {
	case c := <-g.conns:
		return c, nil
	case <-g.done:
		return nil, net.ErrClosed
	}
}

// Close closes the socket and makes Accept fail; it waits for the accept loops.
func (g *gateListener) Close() error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	close(g.done)
	if g.inner != nil {
		g.inner.Close()
		close(g.stop)
		g.inner = nil
	}
	g.mu.Unlock()
	g.wg.Wait()
	return nil
}

// Addr implements net.Listener; it stays valid while the gate is down.
func (g *gateListener) Addr() net.Addr { return g.addr }
