package queue

import "time"

// SetClock makes q read the time from now, for tests of what depends on how old a record is.
func SetClock(q *Queues, now func() time.Time) { q.now = now }

// DropHold unsubscribes q from the hold consumers' deliveries and bounds its releases by
// acknowledgement to wait: a ledger made from then on delivers no ticket to its hold.
func DropHold(q *Queues, wait time.Duration) {
	q.holdMu.Lock()
	q.holdDropped = true
	q.holdMu.Unlock()
	q.unsubscribeHold()
	q.holdWait = wait
}

// HoldSubscribed reports whether q receives the hold consumers' deliveries.
func HoldSubscribed(q *Queues) bool {
	q.holdMu.Lock()
	defer q.holdMu.Unlock()
	return q.holdSub != nil
}

// ReleaseAcked releases the tickets a Sluice-Tickets header names as a worker's ack does, and
// waits for the release.
func ReleaseAcked(q *Queues, tickets string) {
	q.releaseAcked(parseTickets(tickets))
	q.releases.Wait()
}

// ReleasesPublished is how many releases by acknowledgement q published (release.go).
func ReleasesPublished(q *Queues) int { return q.releaser.publishedCount() }

// FormerProbes is how many times q looked for a queue's jobs in a shared stream other than
// its current one (sharedcount.go, probeFormer).
func FormerProbes(q *Queues) uint64 { return q.probes.Load() }

// SetLateHold makes q keep the jobs that come for a fetch that has returned for d (instead of
// a quarter of their consumer's AckWait) before it hands them back (pull.go).
func SetLateHold(q *Queues, d time.Duration) {
	q.pulls.mu.Lock()
	defer q.pulls.mu.Unlock()
	q.pulls.hold = d
}

// LateKept is how many late jobs q keeps for the next fetch of their consumer (pull.go).
func LateKept(q *Queues) int {
	q.pulls.mu.Lock()
	defer q.pulls.mu.Unlock()
	n := 0
	for _, kept := range q.pulls.late {
		n += len(kept)
	}
	return n
}
