package worker

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/leaky"
)

func TestUnitQuota(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		h    http.Header
		want float64
		ok   bool
	}{
		{"none", http.Header{}, 0, false},
		{"openai limit", http.Header{"X-Ratelimit-Limit-Tokens": {"60000"}}, 1000, true},
		{"openai remaining over reset", http.Header{"X-Ratelimit-Limit-Tokens": {"60000"},
			"X-Ratelimit-Remaining-Tokens": {"300"}, "X-Ratelimit-Reset-Tokens": {"1.5s"}}, 200, true},
		{"openai plenty left", http.Header{"X-Ratelimit-Limit-Tokens": {"60000"},
			"X-Ratelimit-Remaining-Tokens": {"59000"}, "X-Ratelimit-Reset-Tokens": {"1s"}}, 1000, true},
		{"anthropic", http.Header{"Anthropic-Ratelimit-Tokens-Limit": {"120000"},
			"Anthropic-Ratelimit-Tokens-Remaining": {"1000"}, "Anthropic-Ratelimit-Tokens-Reset": {"2030-01-01T00:00:10Z"}}, 100, true},
		{"anthropic reset past", http.Header{"Anthropic-Ratelimit-Tokens-Remaining": {"1000"},
			"Anthropic-Ratelimit-Tokens-Reset": {"2029-12-31T23:59:59Z"}}, 0, false},
		{"ratelimit policy in tokens", http.Header{"Ratelimit-Policy": {`"req";q=100;w=60, "tok";q=5000;w=60;qu="tokens"`},
			"Ratelimit": {`"req";r=50;t=30, "tok";r=600;t=6`}}, 100, true},
		{"ratelimit policy in requests only", http.Header{"Ratelimit-Policy": {`"req";q=100;w=60`},
			"Ratelimit": {`"req";r=50;t=30`}}, 0, false},
		{"malformed", http.Header{"X-Ratelimit-Limit-Tokens": {"lots"}, "X-Ratelimit-Remaining-Tokens": {"-1"},
			"X-Ratelimit-Reset-Tokens": {"1s"}}, 0, false},
	} {
		got, ok := unitQuota(c.h, now)
		if ok != c.ok || ok && got != c.want {
			t.Errorf("%s: %v, %v; want %v, %v", c.name, got, ok, c.want, c.ok)
		}
	}
	// The request rate's quota ignores a policy in tokens.
	h := http.Header{"Ratelimit-Policy": {`"req";q=100;w=60, "tok";q=5000;w=60;qu="tokens"`},
		"Ratelimit": {`"req";r=50;t=10, "tok";r=6;t=6`}}
	if got, ok := quotaRate(h, now); !ok || got != 5 {
		t.Errorf("quotaRate = %v, %v; want 5 from the requests policy alone", got, ok)
	}
}

func TestUnitLearner(t *testing.T) {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var u unitLearner
	budget := leaky.Units{N: 90000, Per: time.Minute}
	if got := u.units(budget, now); got != budget {
		t.Fatalf("nothing learned: %v", got)
	}
	u.learn(http.Header{"X-Ratelimit-Limit-Tokens": {"30000"}}, unitsPerSecond(budget), now)
	if got := u.units(budget, now); got.N != 30000 || got.Per != time.Minute {
		t.Errorf("learned 500/s: %v, want 30000/m", got)
	}
	u.learn(http.Header{"X-Ratelimit-Limit-Tokens": {"900000"}}, unitsPerSecond(budget), now)
	if got := u.units(budget, now); got != budget {
		t.Errorf("an upstream above cost_rate: %v, want the budget, its ceiling", got)
	}
	u.learn(http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"5s"}}, unitsPerSecond(budget), now)
	if got := u.units(budget, now); got.N != 900 {
		t.Errorf("nothing left: %v, want the floor, a hundredth of the budget (900/m)", got)
	}
	if got := u.units(budget, now.Add(adaptForget+time.Second)); got != budget {
		t.Errorf("after %v without news: %v, want the budget", adaptForget, got)
	}
}
