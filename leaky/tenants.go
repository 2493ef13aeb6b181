package leaky

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// TenantPauses are the pauses of single tenants of a queue: a fair queue with pause_scope:
// tenant pauses the tenant whose job the upstream answered 429 or 503, not the queue. The queue's
// slots are not affected: the workers hold a paused tenant's jobs back (and its fair scheduler
// releases none of them) while the other tenants' jobs use the slots.
//
// State grows with the tenants paused now only: a tenant whose pause has ended is forgotten at
// the next call on its queue, and a queue none of whose tenants is paused holds no state.
type TenantPauses interface {
	// PauseTenant pauses tenant of queue for d from now on every worker, unless it is paused
	// longer already, and returns the tenants paused after the call with how long each stays
	// paused. d <= 0 only reads.
	PauseTenant(ctx context.Context, queue, tenant string, d time.Duration) (map[string]time.Duration, error)
	// PausedTenants returns the tenants of queue paused now, with how long each stays paused.
	PausedTenants(ctx context.Context, queue string) (map[string]time.Duration, error)
}

var (
	//go:embed lua/tenants.lua
	tenantsLua    string
	tenantsScript = redis.NewScript(tenantsLua)
)

// tenantsKey returns the Redis key holding queue's tenant pauses: a sorted set beside the
// queue's schedule, in its hash slot.
func (r *Redis) tenantsKey(queue string) string { return r.key(queue) + ":tenants" }

// PauseTenant pauses tenant of queue for d; see TenantPauses. One round trip.
func (r *Redis) PauseTenant(ctx context.Context, queue, tenant string, d time.Duration) (map[string]time.Duration, error) {
	if d <= 0 || tenant == "" {
		return r.PausedTenants(ctx, queue)
	}
	return r.tenants(ctx, queue, tenant, ceilMicros(d))
}

// PausedTenants returns the tenants of queue paused now; see TenantPauses. One round trip.
func (r *Redis) PausedTenants(ctx context.Context, queue string) (map[string]time.Duration, error) {
	return r.tenants(ctx, queue, "", 0)
}

func (r *Redis) tenants(ctx context.Context, queue, tenant string, d int64) (map[string]time.Duration, error) {
	args := []any{tenant, d}
	if r.now != nil {
		args = append(args, r.now().UnixMicro())
	}
	res, err := tenantsScript.Run(ctx, r.rdb, []string{r.tenantsKey(queue)}, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("leaky: tenant pauses of %q: %w", queue, err)
	}
	out := make(map[string]time.Duration, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		tenant, ok1 := res[i].(string)
		us, ok2 := res[i+1].(int64)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("leaky: tenant pauses of %q: unexpected reply %v", queue, res)
		}
		out[tenant] = time.Duration(us) * time.Microsecond
	}
	return out, nil
}

// PauseTenant pauses tenant of queue for d; see TenantPauses. It never returns an error.
func (m *Memory) PauseTenant(_ context.Context, queue, tenant string, d time.Duration) (map[string]time.Duration, error) {
	m.tenantsMu.Lock()
	defer m.tenantsMu.Unlock()
	now := m.now().UnixMicro()
	paused := m.pausedLocked(queue, now)
	if d > 0 && tenant != "" {
		if paused == nil {
			paused = map[string]int64{}
			if m.tenants == nil {
				m.tenants = map[string]map[string]int64{}
			}
			m.tenants[queue] = paused
		}
		paused[tenant] = max(paused[tenant], now+ceilMicros(d))
	}
	return remaining(paused, now), nil
}

// PausedTenants returns the tenants of queue paused now; see TenantPauses. It never returns an
// error.
func (m *Memory) PausedTenants(_ context.Context, queue string) (map[string]time.Duration, error) {
	m.tenantsMu.Lock()
	defer m.tenantsMu.Unlock()
	now := m.now().UnixMicro()
	return remaining(m.pausedLocked(queue, now), now), nil
}

// pausedLocked returns queue's tenant pauses (µs until), with the ended ones dropped, as
// lua/tenants.lua does; nil when none is left.
func (m *Memory) pausedLocked(queue string, now int64) map[string]int64 {
	paused := m.tenants[queue]
	for t, until := range paused {
		if until <= now {
			delete(paused, t)
		}
	}
	if len(paused) == 0 {
		delete(m.tenants, queue)
		return nil
	}
	return paused
}

func remaining(paused map[string]int64, now int64) map[string]time.Duration {
	out := make(map[string]time.Duration, len(paused))
	for t, until := range paused {
		out[t] = time.Duration(until-now) * time.Microsecond
	}
	return out
}
