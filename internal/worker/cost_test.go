package worker

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/cost"
)

func TestResponseCost(t *testing.T) {
	js := config.Cost{Kind: config.CostJSON, Name: "/usage/total_tokens"}
	hd := config.Cost{Kind: config.CostHeader, Name: "X-Tokens"}
	for _, tc := range []struct {
		name string
		c    config.Cost
		h    http.Header
		body string
		want int64
		ok   bool
	}{
		{"json", js, nil, `{"usage":{"total_tokens":1234}}`, 1234, true},
		{"json zero", js, nil, `{"usage":{"total_tokens":0}}`, 0, true},
		{"json negative", js, nil, `{"usage":{"total_tokens":-1}}`, 0, false},
		{"json too large", js, nil, `{"usage":{"total_tokens":1099511627777}}`, 0, false},
		{"json string", js, nil, `{"usage":{"total_tokens":"12"}}`, 12, true}, // a number in a string is that number
		{"json missing", js, nil, `{"usage":{}}`, 0, false},
		{"json not json", js, nil, `usage`, 0, false},
		{"json truncated", js, nil, `{"usage":{"total_tokens":12`, 0, false},
		{"json array index", config.Cost{Kind: config.CostJSON, Name: "/a/1"}, nil, `{"a":[5,7]}`, 7, true},
		{"json escaped", config.Cost{Kind: config.CostJSON, Name: "/a~1b/c~0d"}, nil, `{"a/b":{"c~d":9}}`, 9, true},
		{"json leading zero index", config.Cost{Kind: config.CostJSON, Name: "/a/01"}, nil, `{"a":[5,7]}`, 0, false},
		{"header", hd, http.Header{"X-Tokens": {" 77 "}}, "", 77, true},
		{"header missing", hd, http.Header{}, "", 0, false},
		{"header malformed", hd, http.Header{"X-Tokens": {"7x"}}, "", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := cost.FromResponse(tc.c, tc.h, []byte(tc.body))
			if got != tc.want || ok != tc.ok {
				t.Fatalf("responseCost = %d, %v; want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestReadsCostBody: only a queue whose true cost is in a JSON
// answer keeps the body.
func TestReadsCostBody(t *testing.T) {
	units := QueueConfig{}
	units.Units.N, units.Units.Per = 10, 1e9
	for _, tc := range []struct {
		cfg  QueueConfig
		want bool
	}{
		{QueueConfig{}, false},
		{QueueConfig{CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/n"}}, false},
		{withCost(units, config.Cost{Kind: config.CostHeader, Name: "X-N"}), false},
		{withCost(units, config.Cost{Kind: config.CostJSON, Name: "/n"}), true},
	} {
		if got := readsCostBody(&tc.cfg); got != tc.want {
			t.Errorf("readsCostBody(%+v) = %v, want %v", tc.cfg.CostFromResponse, got, tc.want)
		}
	}
}

func withCost(c QueueConfig, cost config.Cost) QueueConfig {
	c.CostFromResponse = cost
	return c
}

func TestUnitReset(t *testing.T) {
	now := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"openai", http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"6m0s"}}, 6 * time.Minute, true},
		{"openai ms", http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"20ms"}}, 20 * time.Millisecond, true},
		{"openai tokens left", http.Header{"X-Ratelimit-Remaining-Tokens": {"12"}, "X-Ratelimit-Reset-Tokens": {"1s"}}, 0, false},
		{"openai malformed", http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"soon"}}, 0, false},
		{"anthropic", http.Header{"Anthropic-Ratelimit-Tokens-Remaining": {"0"}, "Anthropic-Ratelimit-Tokens-Reset": {"2026-11-24T12:00:30Z"}}, 30 * time.Second, true},
		{"anthropic past", http.Header{"Anthropic-Ratelimit-Tokens-Remaining": {"0"}, "Anthropic-Ratelimit-Tokens-Reset": {"2026-11-24T11:00:30Z"}}, 0, false},
		{"bounded", http.Header{"X-Ratelimit-Remaining-Tokens": {"0"}, "X-Ratelimit-Reset-Tokens": {"90h"}}, time.Hour, true},
		{"none", http.Header{}, 0, false},
	} {
		if got, ok := unitReset(tc.h, now); got != tc.want || ok != tc.ok {
			t.Errorf("%s: unitReset = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}
