package fair

import (
	"context"
	"errors"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// counts are the tenants' delivered counts as the leader keeps them: per tenant, the count
// read from the tenants bucket once per leadership, plus what the leader moved since. flush
// writes the ones that changed. Its methods are safe for concurrent use.
type counts struct {
	mu sync.Mutex
	m  map[string]*count
}

// count is one tenant's delivered count.
type count struct {
	base, moved, flushed uint64
	loaded               bool // base was read
}

// add counts n more jobs of tenant id moved.
func (c *counts) add(id string, n int) {
	if n == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*count{}
	}
	e := c.m[id]
	if e == nil {
		e = &count{}
		c.m[id] = e
	}
	e.moved += uint64(n)
}

// reset forgets every count, which another leader may have changed meanwhile.
func (c *counts) reset() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
}

// flush writes to kv, under key(tenant), every count that changed since it was last written,
// up to parallel at once. A count it cannot read or write stays to be written next time.
func (c *counts) flush(ctx context.Context, kv jetstream.KeyValue, key func(string) string, parallel int) {
	c.mu.Lock()
	var dirty []string
	for id, e := range c.m {
		if e.moved != e.flushed {
			dirty = append(dirty, id)
		}
	}
	c.mu.Unlock()
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	for _, id := range dirty {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c.flushOne(ctx, kv, id, key(id))
		}()
	}
	wg.Wait()
}

func (c *counts) flushOne(ctx context.Context, kv jetstream.KeyValue, id, key string) {
	c.mu.Lock()
	e := c.m[id]
	loaded := e != nil && e.loaded
	c.mu.Unlock()
	if e == nil { // reset meanwhile
		return
	}
	if !loaded {
		// A tenant whose count is not in the bucket (new, or expired) has it written in one
		// request; the others' are read once per leadership.
		c.mu.Lock()
		moved := e.moved
		c.mu.Unlock()
		if _, err := kv.Create(ctx, key, strconv.AppendUint(nil, moved, 10)); err == nil {
			c.mu.Lock()
			e.loaded, e.flushed = true, moved
			c.mu.Unlock()
			return
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return
		}
		var base uint64
		got, err := kv.Get(ctx, key)
		if err == nil {
			base, _ = strconv.ParseUint(string(got.Value()), 10, 64)
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return
		}
		c.mu.Lock()
		e.base, e.loaded = base, true
		c.mu.Unlock()
	}
	c.mu.Lock()
	moved, total := e.moved, e.base+e.moved
	c.mu.Unlock()
	if _, err := kv.Put(ctx, key, strconv.AppendUint(nil, total, 10)); err == nil {
		c.mu.Lock()
		e.flushed = moved
		c.mu.Unlock()
	}
}
