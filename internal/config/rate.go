package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Rate is N events per Per: a queue's leak rate. The zero value is no rate at all.
type Rate struct {
	N   int64
	Per time.Duration
}

// ParseRate parses "N/s", "N/m", "N/h" or "N/<duration>" ("5/2s", "1/500ms"), with N > 0 and
// a positive duration, into a Rate. The rate may not be faster than one per nanosecond.
func ParseRate(s string) (Rate, error) {
	bad := func(why string) (Rate, error) {
		return Rate{}, fmt.Errorf("invalid rate %q: %s", s, why)
	}
	const want = "want N/s, N/m, N/h or N/<duration>"
	num, unit, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return bad(want)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			return bad("count out of range")
		}
		return bad(want)
	}
	var per time.Duration
	switch unit = strings.TrimSpace(unit); unit {
	case "s":
		per = time.Second
	case "m":
		per = time.Minute
	case "h":
		per = time.Hour
	default:
		if per, err = time.ParseDuration(unit); err != nil {
			return bad(want)
		}
	}
	r := Rate{N: n, Per: per}
	switch {
	case n <= 0:
		return bad("count must be > 0")
	case per <= 0:
		return bad("period must be > 0")
	case r.Interval() <= 0:
		return bad("faster than one per nanosecond")
	}
	return r, nil
}

// Interval is the time between two events at rate r, Per/N, truncated to the nanosecond.
// It is 0 for the zero Rate.
func (r Rate) Interval() time.Duration {
	if r.N <= 0 {
		return 0
	}
	return r.Per / time.Duration(r.N)
}

// PerSecond is the rate in events per second; 0 for the zero Rate.
func (r Rate) PerSecond() float64 {
	if r.Per <= 0 {
		return 0
	}
	return float64(r.N) / r.Per.Seconds()
}

// String returns r as the file writes it: "50/s", "10/m", "3600/h", "5/2s".
func (r Rate) String() string {
	switch r.Per {
	case time.Second:
		return fmt.Sprintf("%d/s", r.N)
	case time.Minute:
		return fmt.Sprintf("%d/m", r.N)
	case time.Hour:
		return fmt.Sprintf("%d/h", r.N)
	}
	return fmt.Sprintf("%d/%s", r.N, r.Per)
}

// MarshalText implements encoding.TextMarshaler with String's form.
func (r Rate) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseRate.
func (r *Rate) UnmarshalText(b []byte) error {
	v, err := ParseRate(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// DefaultMinRate is the default floor of an adaptive queue's learned rate: r/100, at least 1/s,
// and never above r.
func DefaultMinRate(r Rate) Rate {
	per := r.PerSecond()
	switch {
	case per <= 1:
		return r
	case per/100 >= 1:
		return Rate{N: r.N, Per: r.Per * 100}
	}
	return Rate{N: 1, Per: time.Second}
}
