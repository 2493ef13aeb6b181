package ingress

import (
	"log/slog"
	"sync"
	"time"
)

// quietEvery is how often a failure that repeats is logged again; the repeats in between are
// counted in the next line (and each one in the metrics).
const quietEvery = 10 * time.Second

// quietLog logs a failure that repeats (a publish to a queue JetStream does not answer, say)
// once, then at most once every quietEvery per key with how many it left out, so that an
// outage is a few lines and not one per request. Safe for concurrent use; the zero value is
// ready.
type quietLog struct {
	mu   sync.Mutex
	keys map[string]*quiet
}

type quiet struct {
	last time.Time // the latest line
	left int       // failures since, not logged
}

// error logs msg with args at Error level for key, unless one was logged for key within
// quietEvery of now, in which case it only counts it.
func (q *quietLog) error(log *slog.Logger, now time.Time, key, msg string, args ...any) {
	q.mu.Lock()
	if q.keys == nil {
		q.keys = map[string]*quiet{}
	}
	k := q.keys[key]
	if k == nil {
		k = &quiet{}
		q.keys[key] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < quietEvery {
		k.left++
		q.mu.Unlock()
		return
	}
	left := k.left
	k.last, k.left = now, 0
	if len(q.keys) > 1000 { // keys are queues: bounded by the config, but be safe
		for name, v := range q.keys {
			if now.Sub(v.last) >= quietEvery && name != key {
				delete(q.keys, name)
			}
		}
	}
	q.mu.Unlock()
	if left > 0 {
		args = append(args, "not_logged_since_last", left)
	}
	log.Error(msg, args...)
}
