package leaky

import (
	"context"
	"errors"
	"sync"
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
func TestChecksShareARead(t *testing.T) {
	srv := testenv.Redis(t)
	prefix := testenv.Prefix(t)
	ctx := context.Background()
	s := NewRedis(srv.NewClient(), RedisConfig{Prefix: prefix})
	r := Rate{Interval: time.Hour}
	take(t, s, "q", r)
	slot, err := s.Take(ctx, "q", r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PausedFor(ctx, "q"); err != nil { // loads the script: one call from now on
		t.Fatal(err)
	}
	// The clock is no longer young (two seconds of samples), and the latest reading is older
	// than checkLead.
	c := s.clock("q")
	c.mu.Lock()
	c.born -= youngFor.Microseconds()
	c.mu.Unlock()
	st := s.seen("q")
	st.mu.Lock()
	st.sent = st.sent.Add(-2 * checkLead)
	st.mu.Unlock()

	h := &holdFirst{held: make(chan struct{}), release: make(chan struct{})}
	client := srv.NewClient()
	client.AddHook(h)
	s.rdb = client
	const checks = 16
	errs := make(chan error, checks)
	var started sync.WaitGroup
	check := func() {
		started.Done()
		_, valid, _, err := s.check(ctx, "q", slot)
		if err == nil && !valid {
			err = errors.New("slot not valid")
		}
		errs <- err
	}
	started.Add(1)
	go check()
	<-h.held // the first check's read is on its way: the others find it in flight
	started.Add(checks - 1)
	for range checks - 1 {
		go check()
	}
	started.Wait()
	close(h.release)
	for range checks {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := h.calls.Load(); n != 1 {
		t.Fatalf("%d checks made %d round trips, want 1", checks, n)
	}
	if n := s.refreshes.Load(); n != 1 {
		t.Fatalf("%d shared reads, want 1", n)
	}
}
