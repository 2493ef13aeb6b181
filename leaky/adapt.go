package leaky

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Adaptation is one change of a queue's learned rate (adaptive drain): the rate the upstream is
// believed to take, between Floor and Ceiling, shared by every worker of the queue. Additive
// increase while the upstream answers 2xx, multiplicative decrease when it pushes back (AIMD),
// and a Target when the upstream says how much quota it has left.
type Adaptation struct {
	// Ceiling and Floor bound the learned rate, in deliveries per second; 0 < Floor ≤ Ceiling.
	Ceiling, Floor float64
	// Decrease multiplies the rate by Factor (in (0,1)), unless another decrease happened
	// within Hold: workers that met the same push-back lower it once.
	Decrease bool
	Factor   float64
	Hold     time.Duration
	// Increase adds deliveries per second (≥ 0).
	Increase float64
	// Target, when > 0, lowers the rate to it: what the upstream's remaining quota allows.
	Target float64
	// Forget is how long the learned rate is kept without a change; after it the queue is
	// back at its ceiling.
	Forget time.Duration
}

func (a Adaptation) valid() error {
	if !(a.Floor > 0 && a.Floor <= a.Ceiling) || a.Increase < 0 || a.Target < 0 || a.Forget <= 0 ||
		a.Decrease && !(a.Factor > 0 && a.Factor < 1) {
		return fmt.Errorf("%w: adaptation %+v", ErrInvalidRate, a)
	}
	return nil
}

// apply is the change of lua/adapt.lua, on eff (0: none yet) and the last decrease at decAt.
func (a Adaptation) apply(eff float64, decAt, now int64) (float64, int64, bool) {
	if eff <= 0 || eff > a.Ceiling {
		eff = a.Ceiling
	}
	if a.Target > 0 && a.Target < eff {
		eff = a.Target
	}
	decreased := false
	if a.Decrease && now-decAt >= a.Hold.Microseconds() {
		eff, decAt, decreased = eff*a.Factor, now, true
	}
	eff = min(max(eff+a.Increase, a.Floor), a.Ceiling)
	return eff, decAt, decreased
}

// Adapter is implemented by schedules that keep a learned rate per queue: Memory and Redis.
type Adapter interface {
	// Adapt applies a to queue's learned rate atomically and returns the new rate, in
	// deliveries per second, and whether this call decreased it.
	Adapt(ctx context.Context, queue string, a Adaptation) (float64, bool, error)
}

// Adapt applies a to the queue's learned rate; see Adapter. It never returns an error but for
// an invalid a.
func (m *Memory) Adapt(_ context.Context, queue string, a Adaptation) (float64, bool, error) {
	if err := a.valid(); err != nil {
		return 0, false, err
	}
	m.adaptMu.Lock()
	defer m.adaptMu.Unlock()
	if m.adapt == nil {
		m.adapt = map[string]*learned{}
	}
	now := m.now()
	l := m.adapt[queue]
	if l == nil || now.Sub(l.changed) > a.Forget {
		l = &learned{}
		m.adapt[queue] = l
	}
	var decreased bool
	l.eff, l.decAt, decreased = a.apply(l.eff, l.decAt, now.UnixMicro())
	l.changed = now
	return l.eff, decreased, nil
}

type learned struct {
	eff     float64
	decAt   int64
	changed time.Time
}

var adaptScript = redis.NewScript(adaptLua)

// Adapt applies a to the queue's learned rate, kept in Redis beside its schedule; see Adapter.
func (r *Redis) Adapt(ctx context.Context, queue string, a Adaptation) (float64, bool, error) {
	if err := a.valid(); err != nil {
		return 0, false, err
	}
	dec := "0"
	if a.Decrease {
		dec = "1"
	}
	args := []any{a.Ceiling, a.Floor, dec, a.Factor, a.Hold.Microseconds(), a.Increase, a.Target, a.Forget.Milliseconds()}
	if r.now != nil {
		args = append(args, r.now().UnixMicro())
	}
	res, err := adaptScript.Run(ctx, r.rdb, []string{r.key(queue) + ":adapt"}, args...).Slice()
	if err != nil {
		return 0, false, fmt.Errorf("leaky: adapt %q: %w", queue, err)
	}
	if len(res) != 2 {
		return 0, false, errors.New("leaky: adapt: unexpected reply")
	}
	s, _ := res[0].(string)
	eff, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false, fmt.Errorf("leaky: adapt %q: %w", queue, err)
	}
	n, _ := res[1].(int64)
	return eff, n == 1, nil
}
