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

// SubjectWalks is how many times q read a shared stream's subjects (shared.go, subjectCounts).
func SubjectWalks(q *Queues) uint64 { return q.subjectWalks.Load() }

// SubjectsRead is how many subjects those listings returned in all.
func SubjectsRead(q *Queues) uint64 { return q.subjectsRead.Load() }
