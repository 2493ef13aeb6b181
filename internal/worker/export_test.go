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

// SetIdleWait sets how long p's long pulls wait for a job (idleWait): a runner of a shared
// queue stops after one that expired empty. Call it before Run.
func SetIdleWait(p *Pool, d time.Duration) { p.idleWait = d }

// Running returns the queues p has a runner of now.
func Running(p *Pool) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for name := range p.runners {
		out = append(out, name)
	}
	return out
}
