package admin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// Readiness is kept in the background: a Server runs each of its checks every checkEvery
// (DefaultCheckEvery) while it serves (Watch), and /readyz answers from their latest results,
// in microseconds, without a call to Redis or NATS of its own. A check that has not answered
// for checkStall (DefaultCheckStall) counts as failed from then ("no answer for …"), so a
// dependency that stopped answering (black-holed packets, a SIGSTOPped server) turns /readyz
// to 503 within checkEvery + checkStall, while /readyz itself still answers at once. Serve
// waits up to firstRoundWait for every check's first answer before it serves; a check that
// has not answered yet reads "not checked yet" (503). A Local check (state the process keeps
// in memory, such as the worker's) is run by /readyz itself instead. The cost is each check
// once every checkEvery per process — a PING, a NATS round trip, a JetStream account read —
// whether or not anyone asks.
const (
	// DefaultCheckEvery is how often the checks run in the background.
	DefaultCheckEvery = 500 * time.Millisecond
	// DefaultCheckStall is how long a check may go without an answer before it counts as
	// failed.
	DefaultCheckStall = time.Second
	// firstRoundWait bounds how long Serve waits for the checks' first answers.
	firstRoundWait = 200 * time.Millisecond
)

// errNotChecked is a check's state before its first answer.
var errNotChecked = errors.New("not checked yet")

// checkState is the latest result of one check, and when the run in flight began.
type checkState struct {
	mu       sync.Mutex
	err      error     // the latest run's
	answered bool      // a run has ended
	running  time.Time // when the run in flight began; zero when none is
}

// result is the check's state at now: failed when a run has gone without an answer for stall.
func (st *checkState) result(now time.Time, stall time.Duration) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.running.IsZero() && now.Sub(st.running) >= stall {
		return fmt.Errorf("no answer for %v", now.Sub(st.running).Round(time.Millisecond))
	}
	if !st.answered {
		return errNotChecked
	}
	return st.err
}

func (st *checkState) begin(at time.Time) {
	st.mu.Lock()
	st.running = at
	st.mu.Unlock()
}

func (st *checkState) end(err error) {
	st.mu.Lock()
	st.err, st.answered, st.running = err, true, time.Time{}
	st.mu.Unlock()
}

// Watch runs the server's checks in the background, each every checkEvery (bounded by
// checkTimeout), until ctx ends; it returns once they have. Serve runs it; a second Watch
// while one runs returns at once.
func (s *Server) Watch(ctx context.Context) {
	if !s.watching.CompareAndSwap(false, true) {
		return
	}
	defer s.watching.Store(false)
	var wg, first sync.WaitGroup
	for i, c := range s.checks {
		if c.Local {
			continue
		}
		st := s.states[i]
		first.Add(1)
		wg.Go(func() {
			answered := sync.OnceFunc(first.Done)
			defer answered()
			t := time.NewTimer(0)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				st.begin(time.Now())
				cctx, cancel := context.WithTimeout(ctx, s.checkTimeout)
				err := c.Func(cctx)
				cancel()
				if ctx.Err() != nil {
					st.end(errNotChecked)
					return
				}
				st.end(err)
				answered()
				t.Reset(s.checkEvery)
			}
		})
	}
	go func() { first.Wait(); s.firstRound.close() }()
	wg.Wait()
}

// ready returns each check's current result, by name.
func (s *Server) ready() map[string]error {
	now := time.Now()
	out := make(map[string]error, len(s.checks))
	for i, c := range s.checks {
		if c.Local {
			out[c.Name] = c.Func(context.Background())
			continue
		}
		out[c.Name] = s.states[i].result(now, s.checkStall)
	}
	return out
}
