package ingress

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// The headers of a direct submission that schedule its job.
const (
	hdrDelay     = "Sluice-Delay"
	hdrNotBefore = "Sluice-Not-Before"
	hdrPriority  = "Sluice-Priority"
)

// priorityOf reads the Sluice-Priority of a submission: high, normal (the default) or low;
// a 400 problem for anything else or a repeated header.
func priorityOf(r *http.Request) (queue.Priority, error) {
	v, ok := r.Header[hdrPriority]
	if !ok {
		return queue.PriorityNormal, nil
	}
	p, valid := queue.ParsePriority(strings.ToLower(strings.TrimSpace(v[0])))
	if len(v) != 1 || !valid {
		return "", badRequest("invalid "+hdrPriority, hdrPriority+" must be high, normal or low, once")
	}
	return p, nil
}

// notBefore reads when a job submitted by r to queue q may be delivered: Sluice-Delay (a Go
// duration such as "90s" or "1h30m", or whole seconds as in Retry-After) from now, or
// Sluice-Not-Before (RFC 3339). Zero: at once (no header, a zero delay, or a time already
// past). It returns a 400 problem for a malformed or repeated header, both headers at once, a
// negative delay, or a time beyond the queue's max_delay.
func notBefore(r *http.Request, q *config.Queue, now time.Time) (time.Time, error) {
	delay, hasDelay := r.Header[hdrDelay]
	at, hasAt := r.Header[hdrNotBefore]
	if !hasDelay && !hasAt {
		return time.Time{}, nil
	}
	if hasDelay && hasAt {
		return time.Time{}, badRequest("ambiguous schedule", "send either "+hdrDelay+" or "+hdrNotBefore+", not both")
	}
	var t time.Time
	switch {
	case hasDelay:
		if len(delay) != 1 {
			return time.Time{}, badRequest("invalid "+hdrDelay, hdrDelay+" appears more than once")
		}
		d, err := parseDelay(delay[0])
		if err != nil {
			return time.Time{}, badRequest("invalid "+hdrDelay, hdrDelay+` must be a duration such as "30s" or "1h30m", or whole seconds, not negative`)
		}
		if d > q.MaxDelay {
			return time.Time{}, tooFarAhead(q)
		}
		if d == 0 {
			return time.Time{}, nil
		}
		t = now.Add(d)
	default:
		if len(at) != 1 {
			return time.Time{}, badRequest("invalid "+hdrNotBefore, hdrNotBefore+" appears more than once")
		}
		var err error
		if t, err = time.Parse(time.RFC3339Nano, at[0]); err != nil {
			return time.Time{}, badRequest("invalid "+hdrNotBefore, hdrNotBefore+` must be an RFC 3339 time such as "2030-01-02T15:04:05Z"`)
		}
		if t.Sub(now) > q.MaxDelay {
			return time.Time{}, tooFarAhead(q)
		}
		if !t.After(now) {
			return time.Time{}, nil
		}
	}
	return t.UTC(), nil
}

// parseDelay reads a Sluice-Delay value: whole seconds, or a Go duration.
func parseDelay(s string) (time.Duration, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("invalid delay %q", s)
	}
	return d, nil
}

// tooFarAhead is the problem of a job scheduled beyond q's max_delay.
func tooFarAhead(q *config.Queue) *Problem {
	return badRequest("scheduled too far ahead",
		fmt.Sprintf("queue %q schedules jobs at most %v ahead (max_delay)", q.Name, q.MaxDelay))
}
