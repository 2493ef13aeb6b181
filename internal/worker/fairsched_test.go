package worker

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
)

// TestFairSchedulerOptions: the scheduler keeps 200ms of the queue's rate in the delivery
// stream (2 to fairTargetMax jobs), holds back paused tenants on a queue that pauses by
// tenant, and spaces a tenant at its learned rate when that is below its cap.
func TestFairSchedulerOptions(t *testing.T) {
	paused := func(tenant string) bool { return tenant == "p" }
	for _, c := range []struct {
		name       string
		cfg        QueueConfig
		learned    float64 // tenant a's learned rate; 0: none
		wantTarget int
		wantHeld   bool
		wantRate   float64 // tenant a's rate; 0: none
	}{
		{"slow", QueueConfig{Rate: leaky.Every(1, time.Second)}, 0, 2, false, 0},
		{"20/s", QueueConfig{Rate: leaky.Every(20, time.Second)}, 0, 4, false, 0},
		{"fast", QueueConfig{Rate: leaky.Every(100000, time.Second)}, 0, fairTargetMax, false, 0},
		{"pause by tenant", QueueConfig{Rate: leaky.Every(20, time.Second), PauseTenant: true}, 0, 4, true, 0},
		{"learned below the cap", QueueConfig{Rate: leaky.Every(20, time.Second), Adaptive: true, PauseTenant: true, TenantRate: 5},
			2, 4, true, 2},
		{"learned above its own rate", QueueConfig{Rate: leaky.Every(20, time.Second), Adaptive: true, PauseTenant: true,
			TenantRates: map[string]float64{"a": 1}}, 2, 4, true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := testEnv("f", func() *QueueConfig { return &c.cfg })
			tl := &tenantLearners{env: env}
			if c.learned > 0 {
				tl.get("a").learned.Store(math.Float64bits(c.learned))
			}
			o := newFairScheduler(env, nil, tl, paused).options(&c.cfg)
			if o.Target != c.wantTarget {
				t.Errorf("target %d, want %d", o.Target, c.wantTarget)
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
