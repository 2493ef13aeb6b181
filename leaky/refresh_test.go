package leaky

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// holdFirst is a hook that holds the first script call it sees until release is closed, and
// counts the script calls.
type holdFirst struct {
	calls   atomic.Int64
	held    chan struct{} // closed when the first call is being held
	release chan struct{}
}

func (h *holdFirst) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdFirst) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *holdFirst) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name != "evalsha" && name != "eval" {
			return next(ctx, cmd) // the connection's own handshake
		}
		if h.calls.Add(1) == 1 {
			close(h.held)
			<-h.release
		}
		return next(ctx, cmd)
	}
}

// TestChecksShareARead: the checks of a queue whose latest reading is too old share one round
// trip that reads it again (Redis.refresh): 16 slots let go together cost one call, not 16.
//
// A check shares a read only if it was sent at most checkLead before the check began; a check
// the machine delays longer starts a read of its own, as it should. So the first read is held
// until the other 15 checks joined it, and an attempt in which one came too late (it sent a
// second read) is made again on a fresh queue, up to 5 times.
func TestChecksShareARead(t *testing.T) {
	srv := testenv.Redis(t)
	for attempt := 1; ; attempt++ {
		late, err := checksShareARead(t, srv, fmt.Sprintf("q%d", attempt))
		if err != nil {
			t.Fatal(err)
		}
		if late == 0 {
			return
		}
		t.Logf("attempt %d: a check began more than %v after the read it would share (%v): it read again", attempt, checkLead, late)
		if attempt == 5 {
			t.Fatalf("in 5 attempts, a check always came more than %v after the shared read", checkLead)
		}
	}
}

// checksShareARead runs 16 checks of queue together. It returns how late after the shared
// read a check began when one came too late to share it (0 when all shared it), or an error
// when they did not share one read though all came in time.
func checksShareARead(t *testing.T, srv *testenv.RedisServer, queue string) (time.Duration, error) {
	prefix := testenv.Prefix(t)
	ctx := context.Background()
	s := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix})
	r := Rate{Interval: time.Hour}
	take(t, s, queue, r)
	slot, err := s.Take(ctx, queue, r)
	if err != nil {
		return 0, err
	}
	if _, err := s.PausedFor(ctx, queue); err != nil { // loads the script: one call from now on
		return 0, err
	}
	// The clock is no longer young (two seconds of samples), and the latest reading is older
	// than checkLead.
	c := s.clock(queue)
	c.mu.Lock()
	c.born -= youngFor.Microseconds()
	c.mu.Unlock()
	st := s.seen(queue)
	st.mu.Lock()
	st.sent = st.sent.Add(-2 * checkLead)
	st.mu.Unlock()

	h := &holdFirst{held: make(chan struct{}), release: make(chan struct{})}
	client := srv.NewClient()
	client.AddHook(h)
	s.rdb = client
	const checks = 16
	errs := make(chan error, checks)
	check := func() {
		_, valid, _, err := s.check(ctx, queue, slot)
		if err == nil && !valid {
			err = errors.New("slot not valid")
		}
		errs <- err
	}
	go check()
	<-h.held // the first check's read is on its way: the others find it in flight
	st.mu.Lock()
	sent := st.reading.sent
	st.mu.Unlock()
	for range checks - 1 {
		go check()
	}
	// Wait until each of the others joined the read, or one came too late and read again (its
	// read is not held). Polled: the joins are counted inside refresh, which has no signal.
	deadline := time.Now().Add(10 * time.Second)
	for s.joins.Load() < checks-1 && h.calls.Load() == 1 {
		if time.Now().After(deadline) {
			close(h.release)
			return 0, fmt.Errorf("after 10 s, %d of %d checks joined the read in flight and none read again", s.joins.Load(), checks-1)
		}
		runtime.Gosched()
	}
	late := time.Duration(0)
	if h.calls.Load() > 1 {
		late = time.Since(sent)
		if late < checkLead {
			close(h.release)
			return 0, fmt.Errorf("a check read again %v after the read in flight was sent, within %v", late, checkLead)
		}
	}
	close(h.release)
	for range checks {
		if err := <-errs; err != nil {
			return 0, err
		}
	}
	if late > 0 {
		return late, nil
	}
	if n := h.calls.Load(); n != 1 {
		return 0, fmt.Errorf("%d checks made %d round trips, want 1", checks, n)
	}
	if n := s.refreshes.Load(); n != 1 {
		return 0, fmt.Errorf("%d shared reads, want 1", n)
	}
	return 0, nil
}
