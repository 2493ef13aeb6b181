// Package gcfloor lets a process's heap grow to a floor before the garbage collector runs.
//
// The model: Go collects when the heap has grown by GOGC percent (100) over what the last
// collection left live. Sluice's processes keep little live (a few MiB: rules, connections,
// caches) and allocate a few KiB per request or job, so at tens of thousands of requests a
// second they collect dozens of times a second, each collection a fixed cost whatever the heap
// holds. [Set] keeps the heap goal at no less than a floor: after each collection it sets the
// GC percentage so that the next goal is the larger of the floor and what GOGC=100 would give.
// A heap whose live part passes half the floor is collected exactly as without it.
//
// Guarantees: the heap goal is never below GOGC=100's; the floor only delays collections of a
// small heap. The operator's GOGC environment variable wins: when it is set, Set does nothing.
// GOMEMLIMIT still holds, as the runtime applies it over any percentage.
//
// Costs: up to the floor in resident memory that a tighter collector would have returned, and
// one finalizer run per collection.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
)

// Default is the floor the ingress and the workers set: 64 MiB.
const Default = 64 << 20

// base is the percentage a heap over half the floor is collected at: Go's default GOGC.
const base = 100

var (
	mu      sync.Mutex
	current *tuner // the floor set, nil: none
)

// Set keeps the heap goal of the process at no less than floor bytes from now on, and reports
// whether it did: it does nothing when the GOGC environment variable is set, or when a floor
// was already set (the first call wins). It is safe for concurrent use.
func Set(floor int64) bool {
	if os.Getenv("GOGC") != "" || floor <= 0 {
		return false
	}
	mu.Lock()
	defer mu.Unlock()
	if current != nil {
		return false
	}
	current = &tuner{floor: floor, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	current.tune()
	current.arm()
	return true
}

// tuner sets the GC percentage after each collection.
type tuner struct {
	floor   int64
	sample  []metrics.Sample // used by the finalizer goroutine only
	stopped atomic.Bool      // for tests: no more tuning
}

// arm runs tune after the next collection: a finalizer runs once its object is found
// unreachable, which happens only in a collection, and each run arms the next.
func (t *tuner) arm() {
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		if t.stopped.Load() {
			return
		}
		t.tune()
		t.arm()
	})
}

type sentinel struct{ _ [16]byte } // not zero-sized: those may share an address and never be freed

// tune sets the percentage for the heap the last collection left live.
func (t *tuner) tune() {
	metrics.Read(t.sample)
	live := int64(t.sample[0].Value.Uint64())
	debug.SetGCPercent(percent(t.floor, live))
}

// percent is the GC percentage that puts the heap goal of a live heap at floor, and never
// below base. The runtime's goal is the larger of live × (1 + percent/100) and a minimum heap of
// 4 MiB × percent/100, so the percentage is also capped where that minimum reaches the floor:
// with less live, the minimum is what holds the goal at the floor.
func percent(floor, live int64) int {
	limit := floor * 100 / minHeap
	p := limit
	if live > 0 {
		p = min(floor*100/live-100, limit)
	}
	return int(max(p, base))
}

// minHeap is the runtime's minimum heap goal at GOGC=100.
const minHeap = 4 << 20
