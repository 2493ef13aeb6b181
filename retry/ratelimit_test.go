package retry_test

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/retry"
)

func TestParseRateLimit(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  []retry.Limit
	}{
		{"absent", nil, nil},
		{
			"the contract's example",
			[]string{`"orders-per-key";r=3;t=1`},
			[]retry.Limit{{Policy: "orders-per-key", Remaining: 3, Reset: time.Second, HasReset: true}},
		},
		{
			"several items, whitespace around commas and after semicolons",
			[]string{`"a";r=0;t=3 ,	"b"; r=5; t=60`},
			[]retry.Limit{
				{Policy: "a", Remaining: 0, Reset: 3 * time.Second, HasReset: true},
				{Policy: "b", Remaining: 5, Reset: time.Minute, HasReset: true},
			},
		},
		{
			"several field lines form one list",
			[]string{`"a";r=1`, `"b";r=2;t=4`},
			[]retry.Limit{{Policy: "a", Remaining: 1}, {Policy: "b", Remaining: 2, Reset: 4 * time.Second, HasReset: true}},
		},
		{
			"token names, parameter order, unknown parameters, partition keys",
			[]string{`day;t=7;pk=:cGsx:;r=9;foo="bar";flag`},
			[]retry.Limit{{Policy: "day", Remaining: 9, Reset: 7 * time.Second, HasReset: true}},
		},
		{
			"a repeated parameter: the last one wins",
			[]string{`"a";r=5;r=0;t=1`},
			[]retry.Limit{{Policy: "a", Remaining: 0, Reset: time.Second, HasReset: true}},
		},
		{
			"escapes in names",
			[]string{`"say \"hi\" \\ bye";r=1`},
			[]retry.Limit{{Policy: `say "hi" \ bye`, Remaining: 1}},
		},
		{
			"invalid items dropped: no r, negative r, decimal r, string t, negative t, numeric name, inner list",
			[]string{`"no-r";t=1, "neg";r=-1, "dec";r=1.5, "st";r=1;t="2", "nt";r=1;t=-2, 42;r=1, ("x" "y");r=0, "ok";r=4`},
			[]retry.Limit{{Policy: "ok", Remaining: 4}},
		},
		{"unterminated string breaks the field", []string{`"ok";r=4, "bad;r=0`}, nil},
		{"trailing comma breaks the field", []string{`"ok";r=4,`}, nil},
		{"junk after an item breaks the field", []string{`"ok";r=4 junk`}, nil},
		{"upper-case parameter key breaks the field", []string{`"ok";R=4`}, nil},
		{"integer with 16 digits breaks the field", []string{`"ok";r=1234567890123456`}, nil},
		{"bad base64 breaks the field", []string{`"ok";r=4;pk=:!!:`}, nil},
		{"one broken line breaks the combined field", []string{`"ok";r=4`, `"x";r=`}, nil},
		{"old dictionary syntax", []string{`limit=100, remaining=50, reset=5`}, nil},
		{
			"reset capped at MaxRetryAfter",
			[]string{`"a";r=0;t=100000000`},
			[]retry.Limit{{Policy: "a", Remaining: 0, Reset: retry.MaxRetryAfter, HasReset: true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			for _, l := range tt.lines {
				h.Add("RateLimit", l)
			}
			if got := retry.ParseRateLimit(h); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseRateLimit(%q) =\n %+v\nwant\n %+v", tt.lines, got, tt.want)
			}
		})
	}
}

func TestParseRateLimitPolicy(t *testing.T) {
	tests := []struct {
		name string
		line string
		want []retry.Quota
	}{
		{
			"the contract's example",
			`"orders-per-key";q=10;w=1`,
			[]retry.Quota{{Policy: "orders-per-key", Quota: 10, Window: time.Second, HasWindow: true, Unit: "requests"}},
		},
		{
			"several policies, quota unit, no window",
			`"burst";q=100;qu="requests";w=60, "daily";q=1000;qu="tokens", "bad-unit";q=1;qu=5`,
			[]retry.Quota{
				{Policy: "burst", Quota: 100, Window: time.Minute, HasWindow: true, Unit: "requests"},
				{Policy: "daily", Quota: 1000, Unit: "tokens"},
			},
		},
		{
			"invalid items dropped",
			`"no-q";w=1, "neg";q=-1, "badw";q=1;w=?1, "ok";q=5;w=10`,
			[]retry.Quota{{Policy: "ok", Quota: 5, Window: 10 * time.Second, HasWindow: true, Unit: "requests"}},
		},
		{"broken field ignored", `"ok";q=5;w=`, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{"Ratelimit-Policy": {tt.line}}
			if got := retry.ParseRateLimitPolicy(h); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseRateLimitPolicy(%q) =\n %+v\nwant\n %+v", tt.line, got, tt.want)
			}
		})
	}
}

// FuzzParseRateLimit holds the parser to "never panic, never return a negative value" on any
// input; run with go test -fuzz=FuzzParseRateLimit ./retry.
func FuzzParseRateLimit(f *testing.F) {
	for _, seed := range []string{`"a";r=0;t=3, "b";r=5;t=60`, `x;r=1;pk=:cGsx:`, `("a" "b");r=1`, `"a";r=?1;t=@12`, `"\`} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{"Ratelimit": {v}, "Ratelimit-Policy": {v}}
		for _, l := range retry.ParseRateLimit(h) {
			if l.Remaining < 0 || l.Reset < 0 || l.Reset > retry.MaxRetryAfter {
				t.Fatalf("ParseRateLimit(%q) returned %+v", v, l)
			}
		}
		for _, q := range retry.ParseRateLimitPolicy(h) {
			if q.Quota < 0 || q.Window < 0 {
				t.Fatalf("ParseRateLimitPolicy(%q) returned %+v", v, q)
			}
		}
	})
}
