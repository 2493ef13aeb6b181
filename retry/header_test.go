package retry_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

func TestParseRetryAfter(t *testing.T) {
	tests := []struct {
		name   string
		value  string
		want   time.Duration
		wantOK bool
	}{
		{"delay-seconds", "120", 2 * time.Minute, true},
		{"zero seconds", "0", 0, true},
		{"surrounding whitespace", "  7 ", 7 * time.Second, true},
		{"IMF-fixdate in the future", t0.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{"RFC 850 date", t0.Add(30 * time.Second).Format("Monday, 02-Jan-06 15:04:05 GMT"), 30 * time.Second, true},
		{"asctime date", t0.Add(45 * time.Second).Format(time.ANSIC), 45 * time.Second, true},
		{"date in the past means now", t0.Add(-time.Hour).Format(http.TimeFormat), 0, true},
		{"date now", t0.Format(http.TimeFormat), 0, true},
		{"huge seconds capped", "86400000", retry.MaxRetryAfter, true},
		{"overflowing seconds capped", "999999999999999999999999", retry.MaxRetryAfter, true},
		{"far future date capped", t0.AddDate(5, 0, 0).Format(http.TimeFormat), retry.MaxRetryAfter, true},
		{"empty", "", 0, false},
		{"blank", "   ", 0, false},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"fraction", "1.5", 0, false},
		{"unit suffix", "5s", 0, false},
		{"garbage", "soon", 0, false},
		{"date with a bad zone", "Fri, 14 Mar 2025 15:09:26 PST", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := retry.ParseRetryAfter(tt.value, t0)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.value, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestFromHeaders(t *testing.T) {
	epoch := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }
	tests := []struct {
		name   string
		header http.Header
		want   time.Duration
		wantOK bool
	}{
		{"nothing", http.Header{}, 0, false},
		{"Retry-After seconds", http.Header{"Retry-After": {"3"}}, 3 * time.Second, true},
		{"Retry-After date", http.Header{"Retry-After": {t0.Add(4 * time.Second).Format(http.TimeFormat)}}, 4 * time.Second, true},
		{
			"Retry-After wins over RateLimit and X-RateLimit-Reset",
			http.Header{"Retry-After": {"3"}, "Ratelimit": {`"a";r=0;t=9`}, "X-Ratelimit-Reset": {"20"}},
			3 * time.Second, true,
		},
		{
			"malformed Retry-After falls through to RateLimit",
			http.Header{"Retry-After": {"-1"}, "Ratelimit": {`"a";r=0;t=9`}},
			9 * time.Second, true,
		},
		{"RateLimit exhausted item", http.Header{"Ratelimit": {`"orders-per-key";r=0;t=3`}}, 3 * time.Second, true},
		{
			"RateLimit: longest reset among exhausted items, ignoring those with quota left",
			http.Header{"Ratelimit": {`"a";r=0;t=3, "b";r=5;t=60, "c";r=0;t=10`}},
			10 * time.Second, true,
		},
		{
			"RateLimit spread over several field lines",
			http.Header{"Ratelimit": {`"a";r=0;t=3`, `"c";r=0;t=8`}},
			8 * time.Second, true,
		},
		{
			"RateLimit: malformed items dropped, valid ones kept",
			http.Header{"Ratelimit": {`"a";r=0;t=-4, "b";r=0;t="x", "c";r=0;t=2.5, "d";t=50, "e";r=0;t=6`}},
			6 * time.Second, true,
		},
		{
			"RateLimit with nothing exhausted falls through to X-RateLimit-Reset",
			http.Header{"Ratelimit": {`"a";r=2;t=3`}, "X-Ratelimit-Reset": {"11"}},
			11 * time.Second, true,
		},
		{
			"RateLimit exhausted without t gives no wait",
			http.Header{"Ratelimit": {`"a";r=0`}},
			0, false,
		},
		{
			"syntactically broken RateLimit ignored as a whole",
			http.Header{"Ratelimit": {`"a";r=0;t=3, "b;r=0;t=9`}, "X-Ratelimit-Reset": {"11"}},
			11 * time.Second, true,
		},
		{
			"old dictionary form of RateLimit is not trusted",
			http.Header{"Ratelimit": {`limit=10, remaining=0, reset=30`}},
			0, false,
		},
		{"RateLimit reset capped", http.Header{"Ratelimit": {`"a";r=0;t=999999999`}}, retry.MaxRetryAfter, true},
		{"X-RateLimit-Reset delta", http.Header{"X-Ratelimit-Reset": {"42"}}, 42 * time.Second, true},
		{"X-RateLimit-Reset fractional delta", http.Header{"X-Ratelimit-Reset": {"1.25"}}, 1250 * time.Millisecond, true},
		{"X-RateLimit-Reset epoch seconds", http.Header{"X-Ratelimit-Reset": {epoch(90 * time.Second)}}, 90 * time.Second, true},
		{"X-RateLimit-Reset epoch in the past", http.Header{"X-Ratelimit-Reset": {epoch(-time.Minute)}}, 0, true},
		{
			"X-RateLimit-Reset epoch milliseconds",
			http.Header{"X-Ratelimit-Reset": {strconv.FormatInt(t0.Add(1500*time.Millisecond).UnixMilli(), 10)}},
			1500 * time.Millisecond, true,
		},
		{"X-RateLimit-Reset large delta capped", http.Header{"X-Ratelimit-Reset": {"999999999"}}, retry.MaxRetryAfter, true},
		{"X-RateLimit-Reset absurd capped", http.Header{"X-Ratelimit-Reset": {"100000000000000000000"}}, retry.MaxRetryAfter, true},
		{"X-RateLimit-Reset negative", http.Header{"X-Ratelimit-Reset": {"-3"}}, 0, false},
		{"X-RateLimit-Reset garbage", http.Header{"X-Ratelimit-Reset": {"1e3"}}, 0, false},
		{"X-RateLimit-Reset NaN", http.Header{"X-Ratelimit-Reset": {"NaN"}}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := retry.FromHeaders(tt.header, t0)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("FromHeaders(%v) = %v, %v; want %v, %v", tt.header, got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestMaxRetryAfterIsAdjustable(t *testing.T) {
	old := retry.MaxRetryAfter
	t.Cleanup(func() { retry.MaxRetryAfter = old })
	retry.MaxRetryAfter = 10 * time.Second
	if got, _ := retry.ParseRetryAfter("60", t0); got != 10*time.Second {
		t.Errorf("ParseRetryAfter(60) with a 10s cap = %v", got)
	}
	if got, _ := retry.FromHeaders(http.Header{"X-Ratelimit-Reset": {"30"}}, t0); got != 10*time.Second {
		t.Errorf("X-RateLimit-Reset 30 with a 10s cap = %v", got)
	}
}
