package worker

import (
	"net/http"
	"sync"
	"time"
)

// TimeInQueueBounds are the upper bounds of the buckets of Answers.TimeInQueue: a delivery
// whose job was accepted d before it left counts in the first bucket whose bound is ≥ d, or in
// the last, extra bucket when d is above them all. The ingress's history reads percentiles off
// them, so a p50 or p99 is exact to the width of its bucket.
var TimeInQueueBounds = [...]time.Duration{
	10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond,
	250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2500 * time.Millisecond,
	5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute,
	15 * time.Minute, time.Hour, 6 * time.Hour,
}

// Answers are a queue's delivery attempts that reached an answer (or failed) in this process
// since it started: cumulative counters, for the presence entry the ingress's history reads.
// Deliveries cut short by a shutdown are not counted.
type Answers struct {
	// Delivered counts every attempt: 2xx, 429, 5xx and the others (other 4xx, timeouts,
	// connection errors).
	Delivered uint64
	// R429 and R5xx count the attempts answered 429 and 5xx.
	R429, R5xx uint64
	// TimeInQueue counts the attempts by time from the job's acceptance (Job.CreatedAt) to
	// the attempt, in the buckets of TimeInQueueBounds and one more for longer; attempts of
	// jobs without CreatedAt are not in it.
	TimeInQueue [len(TimeInQueueBounds) + 1]uint64
}

// answers keeps the Answers of every queue. Safe for concurrent use.
type answers struct {
	mu sync.Mutex
	q  map[string]*Answers
}

// add counts an attempt of queue answered status (0: no answer), whose job was
// accepted tiq ago (negative: unknown).
func (a *answers) add(queue string, status int, tiq time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.q == nil {
		a.q = map[string]*Answers{}
	}
	s := a.q[queue]
	if s == nil {
		s = &Answers{}
		a.q[queue] = s
	}
	s.Delivered++
	switch {
	case status == http.StatusTooManyRequests:
		s.R429++
	case status >= 500 && status <= 599:
		s.R5xx++
	}
	if tiq >= 0 {
		i := 0
		for i < len(TimeInQueueBounds) && tiq > TimeInQueueBounds[i] {
			i++
		}
		s.TimeInQueue[i]++
	}
}

// snapshot copies the counters of every queue.
func (a *answers) snapshot() map[string]Answers {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]Answers, len(a.q))
	for name, s := range a.q {
		out[name] = *s
	}
	return out
}

// Answers returns, per queue, the delivery attempts this pool made since it was created, by
// answer and time in queue (see Answers). Safe for concurrent use; the result is a copy.
func (p *Pool) Answers() map[string]Answers { return p.m.answers.snapshot() }
