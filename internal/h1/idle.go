package h1

import (
	"bufio"
	"context"
	"slices"
	"time"
)

// The idle set: the connections waiting for their next request, by host and in the order
// they came back, with the one sweep that closes those idle too long or closed by the server.

// CloseIdleConnections closes the idle connections at once, and those in use (or being
// dialed) when their bodies are closed, instead of taking them back: no connection made
// before the call carries another request. The Client stays usable: connections dialed after
// it are kept as usual.
func (c *Client) CloseIdleConnections() {
	c.mu.Lock()
	c.epoch.Add(1)
	idle := c.idle
	c.idle = nil
	c.lru.Init()
	if c.sweep != nil {
		c.sweep.Stop()
	}
	c.armed = false
	c.mu.Unlock()
	for _, cs := range idle {
		for _, cn := range cs {
			cn.c.Close()
		}
	}
}

func (c *Client) idleTimeout() time.Duration {
	if c.IdleTimeout > 0 {
		return c.IdleTimeout
	}
	return DefaultIdleTimeout
}

// usable reports whether cn, idle since cn.idle, may carry a request at now.
func (c *Client) usable(cn *conn, now time.Time) bool {
	return now.Sub(cn.idle) < c.idleTimeout() && cn.br.Buffered() == 0 && (c.Alive == nil || c.Alive(cn.c))
}

// take returns an idle connection to addr that is usable, or a new one (always a new one
// when fresh).
func (c *Client) take(ctx context.Context, addr string, fresh bool) (*conn, error) {
	for !fresh {
		c.mu.Lock()
		cs := c.idle[addr]
		if len(cs) == 0 {
			c.mu.Unlock()
			break
		}
		cn := cs[len(cs)-1]
		cs[len(cs)-1] = nil
		c.idle[addr] = cs[:len(cs)-1]
		c.lru.Remove(cn.el)
		c.mu.Unlock()
		if c.usable(cn, c.clock()) {
			cn.reuse = true
			return cn, nil
		}
		cn.c.Close()
	}
	epoch := c.epoch.Load()
	nc, err := c.Dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cn := &conn{c: nc, addr: addr, epoch: epoch}
	cn.w.c = nc
	cn.br = bufio.NewReader(nc)
	cn.bw = bufio.NewWriter(&cn.w)
	return cn, nil
}

// put returns cn to the idle set, or closes it when the set is full or CloseIdleConnections
// was called since it was dialed. Its deadline is unset: the request's context did not end
// while it was used.
func (c *Client) put(cn *conn) {
	cn.idle = c.clock()
	max := c.MaxIdle
	if max <= 0 {
		max = DefaultMaxIdle
	}
	var evicted *conn
	c.mu.Lock()
	cs := c.idle[cn.addr]
	if len(cs) >= max || cn.epoch != c.epoch.Load() {
		c.mu.Unlock()
		cn.c.Close()
		return
	}
	if c.idle == nil {
		c.idle = map[string][]*conn{}
	}
	c.idle[cn.addr] = append(cs, cn)
	cn.el = c.lru.PushBack(cn)
	if c.MaxIdleTotal > 0 && c.lru.Len() > c.MaxIdleTotal {
		// The longest idle of all is the longest idle of its host: the first of its list.
		evicted = c.lru.Remove(c.lru.Front()).(*conn)
		c.idle[evicted.addr] = c.idle[evicted.addr][1:]
	}
	if !c.armed {
		c.armLocked(cn.idle)
	}
	c.mu.Unlock()
	if evicted != nil {
		evicted.c.Close()
	}
}

// armLocked sets the sweep for when the longest idle connection expires, or, with Alive, for
// the next probe if that is sooner. lru must not be empty.
func (c *Client) armLocked(now time.Time) {
	d := c.idleTimeout() - now.Sub(c.lru.Front().Value.(*conn).idle)
	if p := c.probeEvery(); c.Alive != nil && p < d {
		d = p
	}
	c.armed = true
	if c.sweep == nil {
		c.sweep = time.AfterFunc(d, c.sweepIdle)
		return
	}
	c.sweep.Reset(d)
}

func (c *Client) probeEvery() time.Duration {
	if c.probe > 0 {
		return c.probe
	}
	return probeEvery
}

// sweepIdle closes the idle connections that expired and, with Alive, those idle for a probe
// period or more that Alive fails, then sets the next sweep, or none when no connection is
// left idle. Connections in use are not in the idle set: a sweep never sees them.
func (c *Client) sweepIdle() {
	now := c.clock()
	horizon := c.idleTimeout() // the idle time from which a connection is looked at
	if p := c.probeEvery(); c.Alive != nil && p < horizon {
		horizon = p
	}
	var gone []*conn
	c.mu.Lock()
	for e := c.lru.Front(); e != nil; {
		cn := e.Value.(*conn)
		if now.Sub(cn.idle) < horizon {
			break // the rest came back later
		}
		e = e.Next()
		if !c.usable(cn, now) {
			c.removeLocked(cn)
			gone = append(gone, cn)
		}
	}
	if c.lru.Len() > 0 {
		c.armLocked(now)
	} else {
		c.armed = false
	}
	c.mu.Unlock()
	for _, cn := range gone {
		cn.c.Close()
	}
}

// removeLocked takes cn, idle, out of the idle set; a host left without idle connections is
// forgotten.
func (c *Client) removeLocked(cn *conn) {
	c.lru.Remove(cn.el)
	cs := c.idle[cn.addr]
	if i := slices.Index(cs, cn); i >= 0 {
		cs = slices.Delete(cs, i, i+1)
	}
	if len(cs) == 0 {
		delete(c.idle, cn.addr)
		return
	}
	c.idle[cn.addr] = cs
}
