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
// increases a twentieth as large (a hundredth within 5%) and decreases half as deep within 15%
// of the rate of the last push-back, and a Target when
// the upstream says how much quota it has left.
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

// apply is the change of lua/adapt.lua on l (eff 0: none yet); it reports whether it decreased.
func (a Adaptation) apply(l *learned, now int64) bool {
	eff := l.eff
	if eff <= 0 || eff > a.Ceiling {
		eff = a.Ceiling
	}
	if a.Target > 0 && a.Target < eff {
		eff = a.Target
	}
	decreased := false
	if a.Decrease && now-l.decAt >= a.Hold.Microseconds() {
		factor := a.Factor
		if l.peak > 0 && eff >= 0.85*l.peak {
			factor = (1 + factor) / 2 // pushed back near the last push-back: step down half as far
		}
		l.peak, eff, l.decAt, decreased = eff, eff*factor, now, true
	}
	inc := a.Increase
	switch {
	case l.peak > 0 && eff >= 0.95*l.peak:
		inc /= 100 // at where the upstream pushed back: probe above it very slowly
	case l.peak > 0 && eff >= 0.85*l.peak:
		inc /= 20 // linger just below where the upstream pushed back
	}
	l.eff = min(max(eff+inc, a.Floor), a.Ceiling)
	return decreased
}

// Adapter is implemented by schedules that keep a learned rate per queue: Memory and Redis.
type Adapter interface {
	// Adapt applies a to queue's learned rate atomically and returns the new rate, in
	// deliveries per second, and whether this call decreased it.
	Adapt(ctx context.Context, queue string, a Adaptation) (float64, bool, error)
	// Learned returns queue's learned rate without changing it; false when none is kept (the
	// queue is at its ceiling).
	Learned(ctx context.Context, queue string) (float64, bool, error)
}

// Learned returns the queue's learned rate; see Adapter. forget is how long it is kept without
// a change (Adaptation.Forget).
func (m *Memory) Learned(_ context.Context, queue string) (float64, bool, error) {
	m.adaptMu.Lock()
	defer m.adaptMu.Unlock()
	l := m.adapt[queue]
	if l == nil || m.now().Sub(l.changed) > l.forget {
		return 0, false, nil
	}
	return l.eff, true, nil
}

// Learned returns the queue's learned rate; see Adapter.
func (r *Redis) Learned(ctx context.Context, queue string) (float64, bool, error) {
	s, err := r.rdb.Eval(ctx, "return redis.call('HGET', KEYS[1], 'eff')", []string{r.key(queue) + ":adapt"}).Text()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("leaky: learned rate of %q: %w", queue, err)
	}
	eff, err := strconv.ParseFloat(s, 64)
	return eff, err == nil, err
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
	decreased := a.apply(l, now.UnixMicro())
	l.changed, l.forget = now, a.Forget
	return l.eff, decreased, nil
}

type learned struct {
	eff     float64
	peak    float64
	decAt   int64
	changed time.Time
	forget  time.Duration
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
