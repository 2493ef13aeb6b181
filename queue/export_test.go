package queue

import "time"

// SetClock makes q read the time from now, for tests of what depends on how old a record is.
func SetClock(q *Queues, now func() time.Time) { q.now = now }

// DropHold unsubscribes q from the hold consumers' deliveries and bounds its releases by
// acknowledgement to wait: a ledger made from then on delivers no ticket to its hold.
func DropHold(q *Queues, wait time.Duration) {
	_ = q.holdSub.Unsubscribe()
	q.holdWait = wait
}

// ReleaseAcked releases the tickets a Sluice-Tickets header names as a worker's ack does, and
// waits for the release.
func ReleaseAcked(q *Queues, tickets string) {
	q.releaseAcked(parseTickets(tickets))
	q.releases.Wait()
}

// ReleasesPublished is how many releases by acknowledgement q published (release.go).
func ReleasesPublished(q *Queues) int { return q.releaser.publishedCount() }
