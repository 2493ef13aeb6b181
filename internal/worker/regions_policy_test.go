package worker

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// renewer is a coordinator that answers with lease, or err; lowering (> 0) is the share its
// write would give, which it tells the holder before answering.
type renewer struct {
	lease    regions.Lease
	err      error
	lowering float64
}

func (r *renewer) Renew(_ context.Context, _ string, _ float64, _ regions.Terms, lower func(float64)) (regions.Lease, regions.Record, error) {
	if r.lowering > 0 {
		lower(r.lowering)
	}
	return r.lease, regions.Record{}, r.err
}

func (r *renewer) Release(context.Context, string, regions.Terms) error { return nil }

func (r *renewer) Watch(ctx context.Context, _ string, _ func() regions.Terms, _ func(time.Time)) {
	<-ctx.Done()
}

// TestRegionalLease: the share is the lease's until it expires, then the safe share; a renewal
// that fails keeps the lease; a share below one delivery per renew period holds the job.
func TestRegionalLease(t *testing.T) {
	for _, tc := range []struct {
		name      string
		safe      float64
		share     float64 // the lease renewed
		after     time.Duration
		wantShare float64
		wantHold  bool
	}{
		{"on its lease", -1, 20, time.Second, 20, false},
		{"expired, even safe share", -1, 20, 3 * time.Second, 25, false},
		{"expired, strict", 0, 20, 3 * time.Second, 0, true},
		{"expired, fixed safe share above the budget", 80, 20, 3 * time.Second, 50, false},
		{"a share too small to use before the next renewal", -1, 1, time.Second, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			cfg := &QueueConfig{Name: "q", Rate: leaky.Every(50, time.Second), Global: true}
			env := testEnv("q", func() *QueueConfig { return cfg })
			env.now = clock.now
			c := &renewer{lease: regions.Lease{Share: tc.share, Expires: clock.now().Add(2 * time.Second)}}
			rl := &regionalLease{env: env, reg: &Regions{Coordinator: c, Regions: 2, SafeShare: tc.safe,
				Lease: 2 * time.Second, Renew: 500 * time.Millisecond}}
			rl.renew(context.Background())
			c.err = errors.New("coordinator unreachable")
			rl.renew(context.Background()) // a failed renewal keeps the lease
			clock.advance(tc.after)
			if s, ok := rl.share(); !ok || s != tc.wantShare {
				t.Errorf("share %v %v, want %v", s, ok, tc.wantShare)
			}
			if v := rl.admit(context.Background(), cfg, testJob("j", "")); (v.kind == admitHold) != tc.wantHold {
				t.Errorf("verdict %+v, want hold %v", v, tc.wantHold)
			}
			// The leak slot's rate: the share, but never below one delivery per renew period,
			// so that jobs admitted before it fell never run at the queue's whole rate.
			if r, want := rl.rate(), max(tc.wantShare, 2); r != want {
				t.Errorf("slot rate %v, want %v", r, want)
			}
		})
	}
	t.Run("a lowering applies before the write", func(t *testing.T) {
		// The worker holds 40; a renewal's write would lower it to 10 and its answer is lost:
		// the worker uses 10 from before the write (the coordinator counts 40 only for the
		// slots reserved ahead), until the lease expires.
		clock := newFakeClock()
		cfg := &QueueConfig{Name: "q", Rate: leaky.Every(50, time.Second), Global: true}
		env := testEnv("q", func() *QueueConfig { return cfg })
		env.now = clock.now
		c := &renewer{lease: regions.Lease{Share: 40, Expires: clock.now().Add(2 * time.Second)}}
		rl := &regionalLease{env: env, reg: &Regions{Coordinator: c, Regions: 2, SafeShare: -1,
			Lease: 2 * time.Second, Renew: 500 * time.Millisecond}}
		rl.renew(context.Background())
		if s, _ := rl.share(); s != 40 {
			t.Fatalf("share %v, want 40", s)
		}
		c.lowering, c.err = 10, errors.New("the answer was lost")
		rl.renew(context.Background())
		if s, _ := rl.share(); s != 10 {
			t.Errorf("after a write that lowered it: share %v, want 10", s)
		}
		c.lowering = 30 // a later write that would give more changes nothing until it answers
		rl.renew(context.Background())
		if s, _ := rl.share(); s != 10 {
			t.Errorf("after a write that would raise it, unanswered: share %v, want 10", s)
		}
		clock.advance(2 * time.Second)
		if s, _ := rl.share(); s != 25 {
			t.Errorf("once the lease expired: share %v, want the safe share 25", s)
		}
	})
	t.Run("not global", func(t *testing.T) {
		cfg := &QueueConfig{Name: "q", Rate: leaky.Every(50, time.Second)}
		rl := &regionalLease{env: testEnv("q", func() *QueueConfig { return cfg }), reg: &Regions{Renew: time.Second}}
		if s, ok := rl.share(); ok || rl.rate() != 0 {
			t.Errorf("a queue without global has share %v", s)
		}
	})
}

// TestRegionalLeaseLost: a region that has held no lease for longer than a lease and a renew
// period raises sluice_region_lease_lost and logs it once; a lease that comes back lowers it.
func TestRegionalLeaseLost(t *testing.T) {
	clock := newFakeClock()
	cfg := &QueueConfig{Name: "q", Rate: leaky.Every(50, time.Second), Global: true}
	env := testEnv("q", func() *QueueConfig { return cfg })
	env.now = clock.now
	var logged bytes.Buffer
	env.log = slog.New(slog.NewTextHandler(&logged, nil))
	c := &renewer{lease: regions.Lease{Share: 20, Expires: clock.now().Add(2 * time.Second)}}
	rl := &regionalLease{env: env, reg: &Regions{Coordinator: c, Regions: 2, SafeShare: -1,
		Lease: 2 * time.Second, Renew: 500 * time.Millisecond}}
	lost := func() float64 { return testutil.ToFloat64(env.m.regionLost.WithLabelValues("q")) }
	rl.renew(context.Background())
	c.err = errors.New("coordinator unreachable")
	clock.advance(2100 * time.Millisecond) // the lease expired: the safe share from here
	for _, step := range []struct {
		advance time.Duration
		want    float64
	}{{0, 0}, {2500 * time.Millisecond, 0}, {100 * time.Millisecond, 1}, {time.Second, 1}} {
		clock.advance(step.advance)
		rl.renew(context.Background())
		if got := lost(); got != step.want {
			t.Fatalf("%v into the safe share: sluice_region_lease_lost = %v, want %v", clock.now().Sub(c.lease.Expires), got, step.want)
		}
	}
	if n := strings.Count(logged.String(), "has held no lease"); n != 1 {
		t.Errorf("the episode was logged %d times, want once:\n%s", n, logged.String())
	}
	c.err, c.lease.Expires = nil, clock.now().Add(2*time.Second)
	rl.renew(context.Background())
	if got := lost(); got != 0 {
		t.Errorf("with a lease again: sluice_region_lease_lost = %v, want 0", got)
	}
}

// TestRegionalUnits: a global queue's unit budget is lowered to the region's fraction of the
// rate — cost_rate over a longer period, cost_burst cut, rounded down — through the lease's
// share, its safe share once it expired, and left whole for a queue that is not global.
func TestRegionalUnits(t *testing.T) {
	units := leaky.Units{N: 500, Per: time.Second, Burst: 100}
	for _, tc := range []struct {
		name   string
		global bool
		share  float64 // the lease's, of a rate of 50/s
		after  time.Duration
		want   leaky.Units
	}{
		{"not global", false, 20, time.Second, units},
		{"on its lease, 40%", true, 20, time.Second, leaky.Units{N: 500, Per: 2500 * time.Millisecond, Burst: 40}},
		{"the whole rate", true, 50, time.Second, units},
		{"expired: the even safe share, 50%", true, 20, 3 * time.Second, leaky.Units{N: 500, Per: 2 * time.Second, Burst: 50}},
		{"a third", true, 50.0 / 3, time.Second, leaky.Units{N: 500, Per: 3 * time.Second, Burst: 33}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			cfg := &QueueConfig{Name: "q", Rate: leaky.Every(50, time.Second), Global: tc.global, Units: units}
			env := testEnv("q", func() *QueueConfig { return cfg })
			env.now = clock.now
			c := &renewer{lease: regions.Lease{Share: tc.share, Expires: clock.now().Add(2 * time.Second)}}
			rl := &regionalLease{env: env, reg: &Regions{Coordinator: c, Regions: 2, SafeShare: -1,
				Lease: 2 * time.Second, Renew: 500 * time.Millisecond}}
			rl.renew(context.Background())
			clock.advance(tc.after)
			u := &unitBudget{env: env, learned: &unitLearner{now: clock.now}, fraction: rl.fraction}
			got := u.ask(cfg, testJob("j", "")).Units
			if d := got.Per - tc.want.Per; got.N != tc.want.N || got.Burst != tc.want.Burst || d < 0 || d > time.Microsecond {
				t.Errorf("units %v, want %v", got, tc.want)
			}
		})
	}
	if got := regionalUnits(units, 0); got.Per != 10000*time.Second || got.Burst != 0 {
		t.Errorf("a share of 0 asks for %v; want the least fraction, 1/10 000", got)
	}
}

// depth is a backlog of n jobs.
type depth uint64

func (d depth) Info(context.Context, string) (queue.Info, error) {
	return queue.Info{Depth: uint64(d)}, nil
}

// TestRegionalDemand: a region's demand is its backlog drained within one renew period, in
// jobs; with a unit budget that binds, what the backlog needs of cost_rate at its jobs' mean
// cost, as the same fraction of the rate.
func TestRegionalDemand(t *testing.T) {
	for _, tc := range []struct {
		name  string
		units leaky.Units
		mean  float64 // the mean cost charged lately
		want  float64
	}{
		// 100 jobs in 500 ms: 200 jobs/s.
		{"no unit budget", leaky.Units{}, 10, 200},
		{"units not charged yet", leaky.Units{N: 500, Per: time.Second}, 0, 200},
		// 2 000 units/s of 250: 8 × cost_rate, as 8 × the rate of 50/s.
		{"units bind", leaky.Units{N: 250, Per: time.Second}, 10, 400},
		{"units bind harder", leaky.Units{N: 100, Per: time.Second}, 10, 1000},
		{"units do not bind", leaky.Units{N: 100000, Per: time.Second}, 10, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &QueueConfig{Name: "q", Rate: leaky.Every(50, time.Second), Global: true, Units: tc.units}
			rl := &regionalLease{env: testEnv("q", func() *QueueConfig { return cfg }), backlog: depth(100),
				meanCost: func() float64 { return tc.mean }, reg: &Regions{Renew: 500 * time.Millisecond}}
			if got := rl.demand(context.Background(), 50); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("demand %v, want %v", got, tc.want)
			}
		})
	}
	u := &unitBudget{}
	for _, c := range []int64{10, 20} {
		u.charged(c)
	}
	if m := u.meanCost(); math.Abs(m-11) > 1e-9 {
		t.Errorf("mean cost of 10 then 20: %v, want 11 (weight %v to the last)", m, costWeight)
	}
}
