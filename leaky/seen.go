package leaky

import (
	"sync"
	"time"
)

// seenState is the latest state of one queue's schedule a Redis has read: its paused_until
// and epoch, as of an instant of the server's clock. Every take's reply carries them, so at a
// throttled rate, where a worker takes a slot every few milliseconds, a slot's check before it
// can be answered from the latest take instead of a round trip of its own (Redis.check).
type seenState struct {
	mu     sync.Mutex
	sent   time.Time // when the request that read the state was sent: it read it no earlier
	server int64     // the server's clock when it read the state, µs
	epoch  int64
	pu     int64     // paused_until, µs of the server's clock; 0 = never paused
	floor  time.Time // states read by requests sent before it are not recorded (forget)
	// reading is the round trip in flight that checks share (Redis.refresh); nil: none.
	reading *stateRead
}

// stateRead is one round trip reading a queue's state, which the checks that need a state
// read no earlier than sent wait for.
type stateRead struct {
	sent time.Time
	done chan struct{} // closed when it is over
	err  error         // set before done is closed
}

// saw records a state read by a request sent at sent, when it is newer than the one recorded.
func (s *seenState) saw(sent time.Time, server, epoch, pu int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sent.Before(s.sent) || sent.Before(s.floor) {
		return
	}
	s.sent, s.server, s.epoch, s.pu = sent, server, epoch, pu
}

// forget drops the recorded state, and every state read by a request sent before t: this
// process changed the state (a pause) before t, so the next check asks.
func (s *seenState) forget(t time.Time) {
	s.mu.Lock()
	s.sent, s.floor = time.Time{}, t
	s.mu.Unlock()
}

// since returns the recorded state when the request that read it was sent at or after t.
func (s *seenState) since(t time.Time) (server, epoch, pu int64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sent.IsZero() || s.sent.Before(t) {
		return 0, 0, 0, false
	}
	return s.server, s.epoch, s.pu, true
}

// seen returns the recorded state of queue's schedule.
func (r *Redis) seen(queue string) *seenState {
	if s, ok := r.states.Load(queue); ok {
		return s.(*seenState)
	}
	s, _ := r.states.LoadOrStore(queue, &seenState{})
	return s.(*seenState)
}
