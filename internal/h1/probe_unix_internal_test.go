//go:build unix

package h1

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// peekOpen is the worker's Alive (internal/worker, open): a non-blocking peek that tells a
// connection the peer closed (or wrote to unasked) from an open one.
func peekOpen(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var buf [1]byte
	var perr error
	if err := raw.Read(func(fd uintptr) bool {
		_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}); err != nil {
		return false
	}
	return errors.Is(perr, syscall.EAGAIN) || errors.Is(perr, syscall.EWOULDBLOCK)
}

// closeConn is a client connection that reports its Close.
type closeConn struct {
	*net.TCPConn
	once   sync.Once
	closed chan struct{}
}

func (c *closeConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return c.TCPConn.Close()
}

// TestTheSweepClosesConnectionsTheServerClosed: with Alive set, an idle connection the server
// closed is closed by the next probe, long before its idle timeout and without a request
// finding it; one whose server keeps it open stays idle through the probes.
func TestTheSweepClosesConnectionsTheServerClosed(t *testing.T) {
	gone := newUpstream(t, func(http.ResponseWriter, *http.Request) {})
	kept := newUpstream(t, func(http.ResponseWriter, *http.Request) {})
	var mu sync.Mutex
	dialed := map[string]*closeConn{}
	var probed atomic.Int64
	var d net.Dialer
	c := &Client{
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			cc := &closeConn{TCPConn: nc.(*net.TCPConn), closed: make(chan struct{})}
			mu.Lock()
			dialed[addr] = cc
			mu.Unlock()
			return cc, nil
		},
		IdleTimeout: time.Hour,
		Alive: func(nc net.Conn) bool {
			probed.Add(1)
			return peekOpen(nc.(*closeConn).TCPConn)
		},
		probe: 20 * time.Millisecond,
	}
	t.Cleanup(c.CloseIdleConnections)
	get(t, c, gone.URL)
	get(t, c, kept.URL)
	mu.Lock()
	goneConn, keptConn := dialed[gone.Listener.Addr().String()], dialed[kept.Listener.Addr().String()]
	mu.Unlock()

	gone.CloseClientConnections() // the server closes its side; the client's sits in CLOSE_WAIT
	select {
	case <-goneConn.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the connection the server closed was not closed by the sweep")
	}
	// The kept one has been probed by the sweeps since (each probes both while both are idle)
	// and is still idle and open.
	for start := probed.Load(); probed.Load() < start+3; {
		select {
		case <-keptConn.closed:
			t.Fatal("the sweep closed a connection its server kept open")
		case <-time.After(5 * time.Millisecond): // polling the probe count
		}
	}
	if n, armed := c.idleCount(); n != 1 || !armed {
		t.Fatalf("%d idle connections, sweep armed %v; want the kept one and true", n, armed)
	}
	get(t, c, kept.URL)
	if n := kept.opened.Load(); n != 1 {
		t.Fatalf("the kept connection was not reused: %d connections", n)
	}
}
