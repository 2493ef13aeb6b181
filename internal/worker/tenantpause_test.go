package worker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/leaky"
)

// TestTenantPauseAdmit: a paused tenant's job is held until its pause ends; others, and any
// job of a queue that does not pause by tenant, go.
func TestTenantPauseAdmit(t *testing.T) {
	clock := newFakeClock()
	byTenant := &QueueConfig{Fair: true, PauseTenant: true}
	byQueue := &QueueConfig{Fair: true}
	env := testEnv("q", func() *QueueConfig { return byTenant })
	env.now = clock.now
	p := &tenantPause{env: env}
	p.tenantsPaused(clock.now(), map[string]time.Duration{"a": 5 * time.Second})
	for _, c := range []struct {
		name   string
		cfg    *QueueConfig
		tenant string
		after  time.Duration
		want   verdict
	}{
		{"paused tenant held to its end", byTenant, "a", 0, holdUntil(clock.now().Add(5*time.Second), "tenant paused")},
		{"later, held to the same end", byTenant, "a", 2 * time.Second, holdUntil(clock.now().Add(5*time.Second), "tenant paused")},
		{"another tenant goes", byTenant, "b", 2 * time.Second, pass()},
		{"no tenant goes", byTenant, "", 2 * time.Second, pass()},
		{"a queue-wide pause scope ignores tenant pauses", byQueue, "a", 2 * time.Second, pass()},
		{"the pause's end lets it go", byTenant, "a", 5 * time.Second, pass()},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock.advance(c.after)
			got := p.admit(context.Background(), c.cfg, testJob("j", c.tenant))
			if got.kind != c.want.kind || !got.until.Equal(c.want.until) || got.reason != c.want.reason {
				t.Fatalf("admit = %+v, want %+v", got, c.want)
			}
		})
	}
	if p.pausedNow("a") {
		t.Fatal("pausedNow(a) after its pause ended")
	}
	p.tenantsPaused(clock.now(), nil)
	if p.until.Load() != nil {
		t.Fatal("no pauses: the map is kept")
	}
}

// fakeTenantPauses answers PausedTenants with its paused map, or err.
type fakeTenantPauses struct {
	mu     sync.Mutex
	paused map[string]time.Duration
	err    error
	reads  chan struct{}
}

func (f *fakeTenantPauses) PauseTenant(context.Context, string, string, time.Duration) (map[string]time.Duration, error) {
	return nil, errors.New("not used")
}

func (f *fakeTenantPauses) PausedTenants(context.Context, string) (map[string]time.Duration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case f.reads <- struct{}{}:
	default:
	}
	return f.paused, f.err
}

// TestTenantPauseRun: the loop reads the store's pauses while the queue pauses by tenant, keeps
// what it knew when a read fails, and forgets them once the queue no longer does.
func TestTenantPauseRun(t *testing.T) {
	clock := newFakeClock()
	var mu sync.Mutex
	cfg := &QueueConfig{Fair: true, PauseTenant: true}
	changes := make(chan struct{})
	env := testEnv("q", func() *QueueConfig { mu.Lock(); defer mu.Unlock(); return cfg })
	env.now = clock.now
	env.until = func(ctx context.Context) bool {
		select {
		case <-changes:
			return true
		case <-ctx.Done():
			return false
		}
	}
	store := &fakeTenantPauses{paused: map[string]time.Duration{"a": time.Minute}, reads: make(chan struct{})}
	p := &tenantPause{env: env, store: store}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	<-store.reads
	<-store.reads // the first read's answer is stored before the second read starts
	if !p.pausedNow("a") || p.pausedNow("b") {
		t.Fatal("after a read: a not paused, or b paused")
	}
	store.mu.Lock()
	store.err = errors.New("redis down")
	store.mu.Unlock()
	<-store.reads
	<-store.reads
	if !p.pausedNow("a") {
		t.Fatal("a failed read forgot the known pause")
	}
	mu.Lock()
	cfg = &QueueConfig{Fair: true}
	mu.Unlock()
	testenv.WaitFor(t, 5*time.Second, "pauses forgotten once the queue pauses by queue", func() bool { return !p.pausedNow("a") })
	cancel()
	<-done
}

// TestTenantPauseSurvivesRedisRestart: a worker that knows a tenant's pause keeps holding the
// tenant to the pause's end after redis-server is killed and restarted without persistence,
// and puts the pause back, so that a process that never knew it (a second store) reads it.
func TestTenantPauseSurvivesRedisRestart(t *testing.T) {
	rs := testenv.Redis(t)
	prefix := testenv.Name(t) + ":"
	store := leaky.NewRedis(rs.Client, leaky.RedisConfig{Prefix: prefix})
	if _, err := store.PauseTenant(context.Background(), "q", "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	cfg := &QueueConfig{Fair: true, PauseTenant: true}
	env := testEnv("q", func() *QueueConfig { return cfg })
	p := &tenantPause{env: env, store: store}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.WaitFor(t, 5*time.Second, "the pause read", func() bool { return p.pausedNow("a") })
	end, _ := p.endOf("a", time.Now())

	if err := rs.Client.Set(context.Background(), prefix+"sentinel", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rs.Stop()
	rs.Start()
	if n, err := rs.Client.Exists(context.Background(), prefix+"sentinel").Result(); err != nil || n != 0 {
		t.Fatalf("after the restart: sentinel key exists %d (%v); the restart must lose the data", n, err)
	}
	other := leaky.NewRedis(rs.NewClient(), leaky.RedisConfig{Prefix: prefix})
	testenv.WaitFor(t, 5*time.Second, "the pause put back in the restarted store", func() bool {
		got, err := other.PausedTenants(context.Background(), "q")
		return err == nil && got["a"] > 0
	})
	got, _ := other.PausedTenants(context.Background(), "q")
	if left := time.Until(end); got["a"] > left+time.Second || got["a"] < left-time.Second {
		t.Errorf("the pause put back has %v left, want about %v", got["a"], left)
	}
	if !p.pausedNow("a") {
		t.Fatal("the worker let go of a's pause inside its end")
	}
	if e, _ := p.endOf("a", time.Now()); !e.Equal(end) && e.Before(end) {
		t.Errorf("the pause's end moved from %v to %v", end, e)
	}
}
