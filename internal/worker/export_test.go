package worker

import "time"

// SetRunningAfter sets how long p lets a first delivery run before recording it as running
// (runningAfter). Call it before Run.
func SetRunningAfter(p *Pool, d time.Duration) { p.runningAfter = d }

// SetSuspicion sets how long p's first deliveries read their status record after a start or a
// reconnect to NATS (suspicion). Call it before Run.
func SetSuspicion(p *Pool, d time.Duration) {
	p.suspicion = func(*QueueConfig) time.Duration { return d }
}
