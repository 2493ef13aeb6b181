package queue

import "time"

// SetClock makes q read the time from now, for tests of what depends on how old a record is.
func SetClock(q *Queues, now func() time.Time) { q.now = now }
