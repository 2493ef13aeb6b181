package client_test

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client"
)

func TestRateLimitState(t *testing.T) {
	tests := []struct {
		name string
		kv   []string
		want client.RateLimitState
	}{
		{
			"draft-11 fields",
			[]string{"RateLimit-Policy", `"orders-per-key";q=10;w=1`, "RateLimit", `"orders-per-key";r=3;t=1`},
			client.RateLimitState{Policy: "orders-per-key", Limit: 10, Remaining: 3, Reset: time.Second, Window: time.Second, Observed: t0},
		},
		{
			"the policy closest to exhaustion among several",
			[]string{
				"RateLimit-Policy", `"burst";q=100;w=60, "per-key";q=10;w=1`,
				"RateLimit", `"burst";r=50;t=30, "per-key";r=2;t=1`,
			},
			client.RateLimitState{Policy: "per-key", Limit: 10, Remaining: 2, Reset: time.Second, Window: time.Second, Observed: t0},
		},
		{
			"RateLimit without a matching policy",
			[]string{"RateLimit-Policy", `"other";q=5`, "RateLimit", `"day";r=7`},
			client.RateLimitState{Policy: "day", Limit: -1, Remaining: 7, Observed: t0},
		},
		{
			"X-RateLimit-* fallback",
			[]string{"X-RateLimit-Limit", "60", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset", "42"},
			client.RateLimitState{Limit: 60, Remaining: 0, Reset: 42 * time.Second, Observed: t0},
		},
		{
			"X-RateLimit-Reset as an epoch",
			[]string{"X-RateLimit-Remaining", "4", "X-RateLimit-Reset", strconv.FormatInt(t0.Add(time.Minute).Unix(), 10)},
			client.RateLimitState{Limit: -1, Remaining: 4, Reset: time.Minute, Observed: t0},
		},
		{
			"malformed RateLimit falls back to X-RateLimit-*",
			[]string{"RateLimit", `"a";r=`, "X-RateLimit-Remaining", "9"},
			client.RateLimitState{Limit: -1, Remaining: 9, Observed: t0},
		},
		{
			"malformed X-RateLimit-* values are unknown",
			[]string{"X-RateLimit-Limit", "lots", "X-RateLimit-Remaining", "-1", "X-RateLimit-Reset", "6"},
			client.RateLimitState{Limit: -1, Remaining: -1, Reset: 6 * time.Second, Observed: t0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newScripted(t, reply(200, "", tt.kv...))
			c, _ := newClient(t, srv.Server)
			if got := c.RateLimit(); !got.Observed.IsZero() {
				t.Fatalf("state before any response = %+v, want the zero value", got)
			}
			resp, err := c.Do(context.Background(), get(t, srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := c.RateLimit(); got != tt.want {
				t.Errorf("RateLimit() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestRateLimitStateKeepsTheLastInformativeResponse(t *testing.T) {
	srv := newScripted(t,
		reply(200, "", "RateLimit", `"k";r=5;t=1`),
		reply(200, ""), // no rate-limit headers: state unchanged
		reply(200, "", "RateLimit", `"k";r=0;t=zzz`), // malformed, no fallback: unchanged
		reply(200, "", "RateLimit", `"k";r=4;t=1`),
	)
	c, _ := newClient(t, srv.Server)
	wantRemaining := []int64{5, 5, 5, 4}
	for i, want := range wantRemaining {
		resp, err := c.Do(context.Background(), get(t, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := c.RateLimit(); got.Remaining != want || got.Policy != "k" {
			t.Errorf("after response %d: %+v, want k with %d remaining", i+1, got, want)
		}
	}
}

// Run with -race: RateLimit is read while other goroutines' responses update it.
func TestRateLimitConcurrentUse(t *testing.T) {
	srv := newScripted(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("RateLimit", `"k";r=`+r.URL.Query().Get("r")+`;t=1`)
	})
	c, _ := newClient(t, srv.Server)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				resp, err := c.Do(context.Background(), get(t, srv.URL+"/?r="+strconv.Itoa(g)))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if st := c.RateLimit(); st.Remaining < 0 || st.Remaining > 7 {
					t.Errorf("torn state %+v", st)
				}
			}
		}()
	}
	wg.Wait()
	if n := len(srv.requests()); n != 80 {
		t.Errorf("server saw %d requests, want 80", n)
	}
}
