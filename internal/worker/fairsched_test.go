package worker

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
)

// TestFairSchedulerOptions: the scheduler keeps 250ms of the queue's rate in the delivery
// stream (1 to fairTargetMax jobs) and, with a unit budget, 250ms of its units; it shares by
// units when the queue says so, holds back paused tenants on a queue that pauses by tenant,
// and spaces a tenant at its learned rate when that is below its cap.
func TestFairSchedulerOptions(t *testing.T) {
	paused := func(tenant string) bool { return tenant == "p" }
	for _, c := range []struct {
		name       string
		cfg        QueueConfig
		learned    float64 // tenant a's learned rate; 0: none
		wantTarget int
		wantUnits  int64 // the target in units; 0: none
		wantHeld   bool
		wantRate   float64 // tenant a's rate; 0: none
	}{
		{"slow", QueueConfig{Rate: leaky.Every(1, time.Second)}, 0, 1, 0, false, 0},
		{"20/s", QueueConfig{Rate: leaky.Every(20, time.Second)}, 0, 5, 0, false, 0},
		{"fast", QueueConfig{Rate: leaky.Every(100000, time.Second)}, 0, fairTargetMax, 0, false, 0},
		{"units", QueueConfig{Rate: leaky.Every(20, time.Second), Units: leaky.Units{N: 20000, Per: time.Minute}}, 0, 5, 84, false, 0},
		{"by units", QueueConfig{Rate: leaky.Every(20, time.Second), Units: leaky.Units{N: 600, Per: time.Second}, FairByUnits: true},
			0, 5, 150, false, 0},
		{"pause by tenant", QueueConfig{Rate: leaky.Every(20, time.Second), PauseTenant: true}, 0, 5, 0, true, 0},
		{"learned below the cap", QueueConfig{Rate: leaky.Every(20, time.Second), Adaptive: true, PauseTenant: true, TenantRate: 5},
			2, 5, 0, true, 2},
		{"learned above its own rate", QueueConfig{Rate: leaky.Every(20, time.Second), Adaptive: true, PauseTenant: true,
			TenantRates: map[string]float64{"a": 1}}, 2, 5, 0, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := testEnv("f", func() *QueueConfig { return &c.cfg })
			tl := &tenantLearners{env: env}
			if c.learned > 0 {
				tl.get("a").learned.Store(math.Float64bits(c.learned))
			}
			o := newFairScheduler(env, nil, tl, paused).options(&c.cfg)
			if o.Target != c.wantTarget || o.TargetUnits != c.wantUnits || o.ByUnits != c.cfg.FairByUnits {
				t.Errorf("target %d jobs and %d units, by units %v; want %d, %d, %v",
					o.Target, o.TargetUnits, o.ByUnits, c.wantTarget, c.wantUnits, c.cfg.FairByUnits)
			}
			if held := o.Held != nil && o.Held("p") && !o.Held("a"); held != c.wantHeld {
				t.Errorf("holds paused tenants: %v, want %v", held, c.wantHeld)
			}
			if o.TenantRates["a"] != c.wantRate {
				t.Errorf("a's rate %v, want %v", o.TenantRates["a"], c.wantRate)
			}
		})
	}
}
