package limit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestMemoryIdleKeysExpire(t *testing.T) {
	ctx := context.Background()
	clk := newClock(base)
	m := NewMemory(MemoryConfig{Now: clk.Now})
	l := Limit{Algorithm: TokenBucket, Limit: 1, Period: time.Second}
	for _, a := range Algorithms {
		l.Algorithm = a
		for i := range 100 {
			if _, err := m.Decide(ctx, fmt.Sprint("k", i), l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := m.Len(); n != 600 {
		t.Fatalf("Len() = %d after 600 keys, want 600", n)
	}
	// A key is idle once its ResetAfter has passed: 1s for most of these, 1s+1µs for the
	// sliding window (a count of 1 weighs floor(1 × left/1s) = 1 at the next window's start).
	// Then it decides as a new key would, and Sweep removes it.
	clk.Add(time.Second - µs)
	if n := m.Sweep(); n != 0 {
		t.Fatalf("Sweep removed %d keys before they were idle", n)
	}
	clk.Add(µs)
	d, err := m.Decide(ctx, "k0", Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Second}, 1)
	if err != nil || !d.Allowed {
		t.Fatalf("an idle key was not treated as new: %s, %v", show(d), err)
	}
	if n := m.Sweep(); n != 499 {
		t.Fatalf("Sweep removed %d idle keys, want 499 (all but the sliding windows and the key just used)", n)
	}
	clk.Add(µs)
	if n := m.Sweep(); n != 100 {
		t.Fatalf("Sweep removed %d idle keys, want the 100 sliding windows", n)
	}
	if n := m.Len(); n != 1 {
		t.Fatalf("Len() = %d after Sweep, want 1", n)
	}
}

// TestMemoryIdleKeysAreRemovedAsNewKeysArrive checks that idle keys go without Sweep: each new
// key moves the clock hand over a few entries and removes the idle ones.
func TestMemoryIdleKeysAreRemovedAsNewKeysArrive(t *testing.T) {
	ctx := context.Background()
	clk := newClock(base)
	m := NewMemory(MemoryConfig{Now: clk.Now, Shards: 1})
	l := Limit{Algorithm: GCRA, Limit: 10, Period: time.Second}
	for i := range 1000 {
		m.Decide(ctx, fmt.Sprint("old", i), l, 1)
	}
	clk.Add(time.Second)
	for i := range 1000 {
		m.Decide(ctx, fmt.Sprint("new", i), l, 1)
	}
	if n := m.Len(); n > 1100 {
		t.Fatalf("Len() = %d: idle keys were not removed as new ones arrived", n)
	}
}

func TestMemoryMaxKeys(t *testing.T) {
	ctx := context.Background()
	clk := newClock(base)
	m := NewMemory(MemoryConfig{MaxKeys: 1000, Now: clk.Now})
	hot := Limit{Algorithm: FixedWindow, Limit: 1 << 40, Period: time.Hour}
	for i := range 100_000 {
		l := Limit{Algorithm: Algorithms[i%len(Algorithms)], Limit: 5, Period: time.Hour}
		if _, err := m.Decide(ctx, fmt.Sprint("flood", i), l, 1); err != nil {
			t.Fatal(err)
		}
		// A key whose state still matters survives the flood: only idle keys are evicted.
		if _, err := m.Decide(ctx, "hot", hot, 1); err != nil {
			t.Fatal(err)
		}
		if i%997 == 0 {
			if n := m.Len(); n > 1000 {
				t.Fatalf("Len() = %d after %d keys, above MaxKeys 1000", n, i+1)
			}
		}
	}
	if n := m.Len(); n > 1000 || n < 900 {
		t.Fatalf("Len() = %d, want at most MaxKeys 1000 and not far below", n)
	}
	d, _ := m.Decide(ctx, "hot", hot, 1)
	if want := hot.Limit - 100_001; d.Remaining != want {
		t.Fatalf("the hot key was evicted during the flood: remaining %d, want %d", d.Remaining, want)
	}
}

// TestMemoryFloodKeepsExhaustedKeys floods a small store with new keys of one rule while another
// rule's key is exhausted: the exhausted key stays rejected (it is never evicted while its
// limit applies), and the flood's keys past MaxKeys share one overflow limit rather than each
// getting a fresh one.
func TestMemoryFloodKeepsExhaustedKeys(t *testing.T) {
	ctx := context.Background()
	clk := newClock(base)
	var reported atomic.Uint64
	m := NewMemory(MemoryConfig{MaxKeys: 64, Shards: 2, Now: clk.Now,
		OnOverflow: func(n uint64) { reported.Store(n) }})
	for _, alg := range Algorithms {
		victim := Limit{Algorithm: alg, Limit: 1, Period: time.Hour}
		if d, _ := m.Decide(ctx, "login\x00victim-"+string(alg), victim, 1); !d.Allowed {
			t.Fatalf("%s: the victim's first request was rejected", alg)
		}
	}
	flood := Limit{Algorithm: TokenBucket, Limit: 5, Period: time.Hour}
	allowed := 0
	for i := range 20_000 {
		d, err := m.Decide(ctx, fmt.Sprintf("api\x00flood-%d", i), flood, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	for _, alg := range Algorithms {
		victim := Limit{Algorithm: alg, Limit: 1, Period: time.Hour}
		if d, _ := m.Decide(ctx, "login\x00victim-"+string(alg), victim, 1); d.Allowed {
			t.Errorf("%s: the exhausted victim key was allowed again after a key flood", alg)
		}
	}
	if n := m.Len(); n > 64 {
		t.Errorf("Len() = %d, above MaxKeys 64", n)
	}
	// At most 64 flood keys found room, each allowed once; the rest shared one bucket of 5.
	if allowed > 64+5 {
		t.Errorf("%d flood requests allowed, want at most %d: overflow keys were not limited", allowed, 64+5)
	}
	if m.Overflows() == 0 || reported.Load() == 0 {
		t.Errorf("Overflows() = %d, reported %d: the overflow was not counted", m.Overflows(), reported.Load())
	}
	// Once the flood's states are idle again, new keys get room of their own.
	clk.Add(time.Hour)
	if d, _ := m.Decide(ctx, "api\x00late", flood, 1); !d.Allowed || d.Remaining != 4 {
		t.Errorf("a new key after the flood went idle: %+v, want allowed with 4 remaining", d)
	}
}

// TestMemoryEvictsIdleKeysFirst fills a store with idle keys and one live key that has not been
// used for a while, then adds new keys: the idle ones make room, the live one keeps its state.
func TestMemoryEvictsIdleKeysFirst(t *testing.T) {
	ctx := context.Background()
	clk := newClock(base)
	m := NewMemory(MemoryConfig{MaxKeys: 8, Shards: 1, Now: clk.Now})
	live := Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Hour}
	brief := Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Second}
	m.Decide(ctx, "live", live, 1)
	for i := range 7 {
		m.Decide(ctx, fmt.Sprint("brief", i), brief, 1)
	}
	clk.Add(time.Second) // the brief keys are idle now
	for i := range 7 {
		m.Decide(ctx, fmt.Sprint("new", i), brief, 1)
	}
	if n := m.Len(); n != 8 {
		t.Fatalf("Len() = %d, want 8", n)
	}
	if d, _ := m.Decide(ctx, "live", live, 1); d.Allowed {
		t.Fatal("the live key was evicted while idle keys were there to go")
	}
}

// TestMemoryConcurrentUse runs many goroutines over overlapping keys, algorithms and evictions
// (meant for -race), then checks the bound and the exactness of a shared key.
func TestMemoryConcurrentUse(t *testing.T) {
	ctx := context.Background()
	m := NewMemory(MemoryConfig{MaxKeys: 256, Shards: 4})
	shared := Limit{Algorithm: SlidingLog, Limit: 50, Period: time.Hour}
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 0))
			for i := range 2000 {
				l := randomLimit(rng, Algorithms[rng.IntN(len(Algorithms))])
				if _, err := m.Decide(ctx, fmt.Sprint("k", rng.IntN(1000)), l, 1); err != nil {
					t.Error(err)
					return
				}
				if i%100 == 0 {
					d, err := m.Decide(ctx, "shared", shared, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mu.Lock()
						admitted++
						mu.Unlock()
					}
				}
				if i%500 == 0 {
					m.Sweep()
				}
			}
		}()
	}
	wg.Wait()
	if n := m.Len(); n > 256 {
		t.Fatalf("Len() = %d, above MaxKeys 256", n)
	}
	// 320 requests on the shared key; it may be evicted in the churn (and then admits again),
	// but never admits more than its limit while it is held.
	if admitted < 50 {
		t.Fatalf("shared key admitted %d of 320 requests, want at least its limit 50", admitted)
	}
}

func TestMemoryConfigDefaults(t *testing.T) {
	m := NewMemory(MemoryConfig{})
	if len(m.shards) != 64 || m.shards[0].t.max != (1<<20)/64 {
		t.Fatalf("default store: %d shards of %d keys, want 64 of %d", len(m.shards), m.shards[0].t.max, (1<<20)/64)
	}
	m = NewMemory(MemoryConfig{MaxKeys: 10, Shards: 100})
	if len(m.shards) != 8 || m.shards[0].t.max != 1 {
		t.Fatalf("MaxKeys 10, Shards 100: %d shards of %d keys, want 8 of 1", len(m.shards), m.shards[0].t.max)
	}
}

// TestMemoryScopesShareKeys floods one scope (a rule) with keys and checks that another
// scope's new keys still get rooms of their own, each its full allowance, once the budget is
// shared (SetScopes); and that a flood past its share is decided on its overflow state.
func TestMemoryScopesShareKeys(t *testing.T) {
	ctx := context.Background()
	clk := newClock(base)
	const maxKeys = 256
	m := NewMemory(MemoryConfig{MaxKeys: maxKeys, Shards: 1, Now: clk.Now})
	m.SetScopes(2)
	cheap := Limit{Algorithm: FixedWindow, Limit: 1, Period: time.Hour}
	for i := range 5_000 {
		if _, err := m.Decide(ctx, fmt.Sprintf("cheap\x00flood-%d", i), cheap, 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := m.Len(); n > maxKeys/2 {
		t.Errorf("the flooded scope holds %d keys, above its share %d", n, maxKeys/2)
	}
	login := Limit{Algorithm: SlidingLog, Limit: 3, Period: time.Hour}
	for c := range maxKeys / 2 {
		key := fmt.Sprintf("login\x00client-%d", c)
		for i := range 4 {
			d, err := m.Decide(ctx, key, login, 1)
			if err != nil {
				t.Fatal(err)
			}
			if want := i < 3; d.Allowed != want {
				t.Fatalf("client %d request %d: allowed %v, want %v: a new client of another rule must get its own allowance", c, i+1, d.Allowed, want)
			}
		}
	}
	// A scope alone borrows what nobody reserves: with one scope, the whole budget is its.
	solo := NewMemory(MemoryConfig{MaxKeys: maxKeys, Shards: 1, Now: clk.Now})
	solo.SetScopes(1)
	for i := range maxKeys {
		if d, _ := solo.Decide(ctx, fmt.Sprintf("only\x00k-%d", i), cheap, 1); !d.Allowed {
			t.Fatalf("key %d of the only scope was refused", i)
		}
	}
	if solo.Overflows() != 0 {
		t.Errorf("%d overflows with one scope under MaxKeys", solo.Overflows())
	}
}

// TestScopesCommitted checks the reservation count as scopes fill and empty.
func TestScopesCommitted(t *testing.T) {
	var s scopes
	s.setShares(3, 30) // share 10, three reserved: 30
	a, b := s.index("a"), s.index("b")
	for range 10 {
		if !s.admits(a, 30) {
			t.Fatal("a refused below its share")
		}
		s.add(a, 1)
	}
	if s.committed != 30 || s.admits(a, 30) {
		t.Fatalf("committed %d, a admitted past its share with every other share reserved", s.committed)
	}
	if !s.admits(b, 30) {
		t.Fatal("b refused below its share")
	}
	s.setShares(2, 30) // share 15: a may have 5 more
	for range 5 {
		if !s.admits(a, 30) {
			t.Fatal("a refused below its new share")
		}
		s.add(a, 1)
	}
	if s.admits(a, 30) || s.committed != 30 {
		t.Fatalf("committed %d after a took its share", s.committed)
	}
	for range 15 {
		s.add(a, -1)
	}
	if s.committed != 30 { // two unseen shares again
		t.Fatalf("committed %d once a is empty, want 30", s.committed)
	}
}
