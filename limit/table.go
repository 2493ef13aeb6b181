package limit

// entry is the state of one key: 40 bytes, whatever the algorithm.
type entry struct {
	id  uint64   // the key's hash with the flag bits below; 0 marks a free entry
	exp int64    // when the state becomes idle, µs since the Unix epoch
	s   [3]int64 // the algorithm's state (see decide); free entries chain the free list in s[0]
}

// Flag bits in the low bits of entry.id; the rest is the key's hash.
const (
	flagUsed  uint64 = 1 << iota // set in every entry in use, so that an id is never 0
	flagLog                      // a SlidingLog key, whose log is in table.logs
	flagPeaks                    // a TokenBucket key, whose record of levels is in table.peaks
	flagMask  = flagUsed | flagLog | flagPeaks
)

const (
	pageBits  = 8
	pageSize  = 1 << pageBits
	sweepStep = 2  // entries the clock hand checks for idleness on each new key
	evictScan = 64 // entries the clock hand looks at, at most, to find an idle one
)

// table is a hash table of entries, bounded to max entries. Entries live in pages of pageSize
// that are never moved or freed; slots is an open-addressing index (linear probing, at most
// half full) of entry numbers + 1, and a clock hand walks the entries to find idle ones. The
// zero value with max set is an empty table.
type table struct {
	slots []uint32
	pages []*[pageSize]entry
	used  int    // entry numbers handed out so far; free ones are reused first
	free  uint32 // first free entry number + 1, 0 for none
	n     int    // entries in use
	max   int
	hand  int
	logs  map[uint64]*slidingLogState
	peaks map[uint64]*peaks

	sc      scopes
	scopeOf []*[pageSize]uint16 // the scope index of each entry, paged as pages
}

func (t *table) entry(i int) *entry { return &t.pages[i>>pageBits][i&(pageSize-1)] }

// home returns the slot where the search for id starts.
func (t *table) home(id uint64) int { return int(id>>8) & (len(t.slots) - 1) }

// get returns the entry of id, whose key is key; a new entry has zero state. An idle entry keeps
// its state, which the algorithms treat as the zero value would be treated. ext is flagLog for
// a SlidingLog key, with a log in t.logs, flagPeaks for a TokenBucket key, with a record in
// t.peaks, or 0. now is for removing idle entries. It returns nil
// for a new key when the table is full, or its scope has used its share and no unreserved room
// is left (scopes), and no idle entry is found to make room.
func (t *table) get(id uint64, now int64, ext uint64, key string) *entry {
	if e := t.find(id); e != nil {
		return e
	}

	sc := t.sc.index(scopeOf(key))
	if !t.sc.admits(sc, t.max) && (t.sweep(now, evictScan) == 0 || !t.sc.admits(sc, t.max)) {
		return nil
	}
	if t.n >= t.max {
		if !t.evict(now) {
			return nil
		}
	} else {
		t.sweep(now, sweepStep)
	}
	var i int
	if t.free != 0 {
		i = int(t.free - 1)
		t.free = uint32(t.entry(i).s[0])
	} else {
		i = t.used
		t.used++
		if i>>pageBits == len(t.pages) {
			t.pages = append(t.pages, new([pageSize]entry))
			t.scopeOf = append(t.scopeOf, new([pageSize]uint16))
		}
	}
	t.scopeOf[i>>pageBits][i&(pageSize-1)] = sc
	t.sc.add(sc, 1)
	if 2*(t.n+1) > len(t.slots) {
		t.grow() // before entry i is in use, so grow does not index it
	}
	e := t.entry(i)
	*e = entry{id: id}
	switch ext {
	case flagLog:
		e.id |= flagLog
		if t.logs == nil {
			t.logs = make(map[uint64]*slidingLogState)
		}
		t.logs[id] = &slidingLogState{}
	case flagPeaks:
		e.id |= flagPeaks
		if t.peaks == nil {
			t.peaks = make(map[uint64]*peaks)
		}
		t.peaks[id] = &peaks{}
	}
	t.n++
	t.place(i)
	return e
}

// addPeaks gives e, the entry of id, a record of levels that knows nothing at or before now,
// and returns it.
func (t *table) addPeaks(e *entry, id uint64, now int64) *peaks {
	e.id |= flagPeaks
	if t.peaks == nil {
		t.peaks = make(map[uint64]*peaks)
	}
	r := &peaks{Since: now}
	t.peaks[id] = r
	return r
}

// find returns the entry of id, or nil.
func (t *table) find(id uint64) *entry {
	if len(t.slots) == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(id); t.slots[i] != 0; i = (i + 1) & mask {
		if e := t.entry(int(t.slots[i] - 1)); e.id&^(flagLog|flagPeaks) == id {
			return e
		}
	}
	return nil
}

// place indexes entry i.
func (t *table) place(i int) {
	mask := len(t.slots) - 1
	j := t.home(t.entry(i).id)
	for t.slots[j] != 0 {
		j = (j + 1) & mask
	}
	t.slots[j] = uint32(i + 1)
}

// grow doubles the index.
func (t *table) grow() {
	t.slots = make([]uint32, max(16, 2*len(t.slots)))
	for i := range t.used {
		if t.entry(i).id != 0 {
			t.place(i)
		}
	}
}

// remove frees entry i.
func (t *table) remove(i int) {
	e := t.entry(i)
	mask := len(t.slots) - 1
	j := t.home(e.id)
	for t.slots[j] != uint32(i+1) {
		j = (j + 1) & mask
	}
	// Backward-shift deletion: move up every later entry of the probe run that may move into
	// the hole, so that searches never stop short at it.
	for k := (j + 1) & mask; t.slots[k] != 0; k = (k + 1) & mask {
		h := t.home(t.entry(int(t.slots[k] - 1)).id)
		if (j < k && (h <= j || h > k)) || (j > k && h <= j && h > k) {
			t.slots[j] = t.slots[k]
			j = k
		}
	}
	t.slots[j] = 0
	if e.id&flagLog != 0 {
		delete(t.logs, e.id&^flagLog)
	}
	if e.id&flagPeaks != 0 {
		delete(t.peaks, e.id&^flagPeaks)
	}
	*e = entry{s: [3]int64{int64(t.free)}}
	t.free = uint32(i + 1)
	t.n--
	t.sc.add(t.scopeOf[i>>pageBits][i&(pageSize-1)], -1)
}

// sweep moves the clock hand over up to steps entries, removing the idle ones, and returns how
// many it removed.
func (t *table) sweep(now int64, steps int) int {
	removed := 0
	for range min(steps, t.used) {
		i := t.hand
		t.hand = (t.hand + 1) % t.used
		if e := t.entry(i); e.id != 0 && e.exp <= now {
			t.remove(i)
			removed++
		}
	}
	return removed
}

// evict removes an idle entry to make room, the first one the clock hand finds within
// evictScan entries, and reports whether it found one. Entries whose state still matters are
// never removed.
func (t *table) evict(now int64) bool {
	for range min(evictScan, t.used) {
		i := t.hand
		t.hand = (t.hand + 1) % t.used
		if e := t.entry(i); e.id != 0 && e.exp <= now {
			t.remove(i)
			return true
		}
	}
	return false
}
