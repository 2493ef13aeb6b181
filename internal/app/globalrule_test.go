package app

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/sluice-rl/sluice/internal/regions"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// globalRuleScale is the figure's scale: the rule's limit per period, the regions' lease and
// renew. The default runs in about ten seconds (make test); SLUICE_RULE_PERIOD=1m runs the
// issue's 1 000 per minute with the default lease and renew (make soak, about five minutes).
// The time is scaled (a 2 s period, a 100 ms renew), the limit less so: the lease: 3 loses up
// to 2 per ingress and period (a lease's leftovers expire with it), 1% of 200.
func globalRuleScale(t *testing.T) (limit int, period, lease, renew time.Duration) {
	if os.Getenv("SLUICE_RULE_PERIOD") == "1m" {
		return 1000, time.Minute, 10 * time.Second, 2500 * time.Millisecond
	}
	return 200, 2 * time.Second, time.Second, 100 * time.Millisecond
}

// admission is one answer of the figure's load: which region, when (the midpoint of the
// request, which the limiter decided in between), admitted or not.
type admission struct {
	region string
	at     time.Time
	ok     bool
	limit  string // X-RateLimit-Limit: the region's part of the limit
}

// ruleFigure is one run of the global rule's figure: two regions, each an ingress with its
// own redis-server, one coordinator NATS; one key's requests, offered at twice the limit, split
// 50/50 between the regions for split periods and then 100/0 for after more (the shift on a
// period's boundary, as a fixed window's).
type ruleFigure struct {
	algorithm     string
	limit         int
	period, lease time.Duration
	renew         time.Duration
	ruleLease     int // the rule's lease: N
	global        bool
	split, after  int
	unaligned     bool // the periods start when the regions are ready, not on the epoch's boundaries
}

// periodCount is what one period of a ruleFigure admitted.
type periodCount struct {
	split           string // "50/50" or "100/0"
	from, to        time.Time
	admitted, asked int
	a, b            int
	limits          map[string]int // answers by region=X-RateLimit-Limit
}

// TestGlobalRuleTwoRegions is the figure for a rule's global limit: two regions, each an
// ingress with its own redis-server, one coordinator NATS; a fixed_window rule of 200 per 2 s
// per key with lease: 3, global (lease 1 s, renew 100 ms). One key's requests, offered at twice
// the limit, split 50/50 between the regions for two periods and then 100/0 for two more (the
// shift on a period's boundary, as a fixed window's). In every period: admitted ≤ limit +
// R·(lease − 1) (docs/design/regions.md, "Rules": connected, no share moved inside the period),
// + R requests the client cannot place (in flight across the boundary), and ≥ 95% of the
// limit. SLUICE_RULE_PERIOD=1m runs 1 000 per minute with lease 10 s, renew 2.5 s (make soak).
func TestGlobalRuleTwoRegions(t *testing.T) {
	limit, period, lease, renew := globalRuleScale(t)
	// SLUICE_RULE_ALGORITHM=gcra (or another) logs the same periods for that algorithm, for
	// BENCHMARKS.md, without asserting them: a bucket's per-period figure is its capacity plus
	// the limit, and it loses part of the period a shift takes to follow.
	// SLUICE_RULE_GLOBAL=false runs it as two independent regions (the rule not global), the
	// comparison: each region admits the whole limit.
	algorithm, asserted := "fixed_window", true
	if a := os.Getenv("SLUICE_RULE_ALGORITHM"); a != "" {
		algorithm, asserted = a, a == "fixed_window"
	}
	global := os.Getenv("SLUICE_RULE_GLOBAL") != "false"
	asserted = asserted && global
	const ruleLease, nRegions = 3, 2
	f := ruleFigure{algorithm: algorithm, limit: limit, period: period, lease: lease, renew: renew, ruleLease: ruleLease,
		global: global, split: 2, after: 2}
	// The bound, and what the client cannot place: each region's load sends one request at a
	// time, so at most one per region is in flight across a period's boundary, decided in one
	// period and placed (by its midpoint) in the other.
	bound, inFlight := limit+nRegions*(ruleLease-1), nRegions
	// The floor takes the process being scheduled: the regions' renewals (every 100 ms) move
	// the parts to the demand, and a process that stalls holds them where they were (beside
	// other builds, 188 of 190 in a shift's period). A run whose every shortfall the process's
	// stalls in that period explain (testenv.Lag: the limit's worth of the time lost at least
	// covers the requests missing) is made again, up to 3 times; any other fails, and the
	// bound is never retried.
	lag := testenv.NewLag(t)
	for attempt := 1; ; attempt++ {
		var counts []periodCount
		t.Run(fmt.Sprintf("attempt %d", attempt), func(t *testing.T) { counts = f.run(t) })
		if !asserted {
			return
		}
		var explained []string
		for w, c := range counts {
			if c.admitted > bound+inFlight {
				t.Errorf("period %d (%s): admitted %d > limit + R·(lease − 1) = %d, + %d in flight at the boundary", w+1, c.split, c.admitted, bound, inFlight)
			}
			msg, stalled := shortfall(lag, w, c, limit, period)
			if msg == "" {
				continue
			}
			if !stalled || attempt == 3 {
				t.Error(msg)
				continue
			}
			explained = append(explained, msg)
		}
		if t.Failed() || len(explained) == 0 {
			return
		}
		t.Logf("attempt %d: %s: again", attempt, strings.Join(explained, "; "))
	}
}

// TestGlobalRuleTwoRegionsGCRA is the figure for a bucket: a gcra rule of 200 per 8 s per key
// with lease: 3, global (lease 1 s, renew 250 ms), 50/50 for a period (which empties the
// buckets a new key starts with full: that period admits up to their capacity more), then 100/0.
// GCRA loses what the moved part would have admitted while the shift is followed (the
// region that stopped yields its part once its rate has fallen below half its demand, about
// half a renew period; the other takes it once the lowered part's reserved time, 200 ms, is
// over): in the shift's period ≥ 95% of the limit, as in every period with demand above it.
// A period admits at most the limit plus the regions' capacities (the buckets full at its
// start: the limit), and less the requests a lease: 3 leaves unused. The scale (1 000
// per minute, the default renew) runs with SLUICE_RULE_PERIOD=1m (make soak).
func TestGlobalRuleTwoRegionsGCRA(t *testing.T) {
	f := ruleFigure{algorithm: "gcra", limit: 200, period: 8 * time.Second, lease: time.Second, renew: 250 * time.Millisecond,
		ruleLease: 3, global: true, split: 1, after: 1, unaligned: true}
	if os.Getenv("SLUICE_RULE_PERIOD") == "1m" {
		f.limit, f.period, f.lease, f.renew = 1000, time.Minute, 10*time.Second, 2500*time.Millisecond
	}
	// The floor is retried as TestGlobalRuleTwoRegions's: only when the process's stalls in a
	// short period explain what it missed, up to 3 times; the upper bound never.
	lag := testenv.NewLag(t)
	for attempt := 1; ; attempt++ {
		var counts []periodCount
		t.Run(fmt.Sprintf("attempt %d", attempt), func(t *testing.T) { counts = f.run(t) })
		var explained []string
		for w, c := range counts {
			if most := 2*f.limit + 2; c.admitted > most {
				t.Errorf("period %d (%s): admitted %d > the limit and the buckets' capacity, %d", w+1, c.split, c.admitted, most)
			}
			msg, stalled := shortfall(lag, w, c, f.limit, f.period)
			if msg == "" {
				continue
			}
			if !stalled || attempt == 3 {
				t.Error(msg)
				continue
			}
			explained = append(explained, msg)
		}
		if t.Failed() || len(explained) == 0 {
			return
		}
		t.Logf("attempt %d: %s: again", attempt, strings.Join(explained, "; "))
	}
}

// shortfall checks period w's floor: with demand at twice the limit, 95% of it; a loaded
// machine whose clients asked less (the last period asked 119 of the 400 meant in one run) is
// held to what they asked. It returns "" when the floor is met; else why not, and whether the
// process's stalls in the period (lag) explain it: the limit's worth of the time lost at least
// covers the requests missing.
func shortfall(lag *testenv.Lag, w int, c periodCount, limit int, period time.Duration) (string, bool) {
	want := min(0.95*float64(limit), float64(c.asked))
	if float64(c.admitted) >= want {
		return "", false
	}
	lost, _ := lag.Lost(c.from, c.to)
	worth := lost.Seconds() * float64(limit) / period.Seconds()
	return fmt.Sprintf("period %d (%s): admitted %d of %d asked, want at least %.0f (95%% of the limit %d, or all asked); the process lost %v of it to stalls, %.1f requests' worth",
		w+1, c.split, c.admitted, c.asked, want, limit, lost.Round(time.Millisecond), worth), worth >= want-float64(c.admitted)
}

// run runs the figure and returns what each period admitted, logging it.
func (f ruleFigure) run(t *testing.T) []periodCount {
	t.Helper()
	algorithm, limit, period, lease, renew, ruleLease, global := f.algorithm, f.limit, f.period, f.lease, f.renew, f.ruleLease, f.global
	coord := testenv.NATS(t)
	up := workertest.NewRecorder(t)
	ingresses := map[string]*running{}
	for _, region := range []string{"a", "b"} {
		dir := t.TempDir()
		ingresses[region] = start(t, dir, fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: %s
redis: {url: %q}
region: %s
regions: {names: [a, b], coordinator: %q, lease: %s, renew: %s}
rules:
  - {name: per-key, key: [header:X-Key], algorithm: %s, limit: %d, period: %s, lease: %d, global: %t}
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), up.URL, testenv.Redis(t).URL(), region, coord.URL, lease, renew,
			algorithm, limit, period, ruleLease, global))
	}
	cjs, err := jetstream.New(testenv.Connect(t, coord.URL))
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	t.Cleanup(client.CloseIdleConnections)
	var mu sync.Mutex
	var log []admission
	send := func(region string) (bool, string) {
		req, _ := http.NewRequest("GET", "http://"+ingresses[region].listen+"/api", nil)
		req.Header.Set("X-Key", "k1")
		t0 := time.Now()
		res, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return false, ""
		}
		res.Body.Close()
		mid := t0.Add(time.Since(t0) / 2)
		ok := res.StatusCode == http.StatusOK
		mu.Lock()
		log = append(log, admission{region, mid, ok, res.Header.Get("X-Ratelimit-Limit")})
		mu.Unlock()
		return ok, res.Header.Get("X-Ratelimit-Limit")
	}
	// The load: twice the limit in all, split by share(region, now) between the regions.
	var phaseAt time.Time // the first period of the split 50/50; the shift two periods later
	var phaseMu sync.Mutex
	share := func(region string, now time.Time) float64 {
		phaseMu.Lock()
		defer phaseMu.Unlock()
		if phaseAt.IsZero() || now.Before(phaseAt.Add(time.Duration(f.split)*period)) {
			return 0.5
		}
		if region == "a" {
			return 1
		}
		return 0
	}
	offered := 2 * float64(limit) / period.Seconds() // requests per second, both regions
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, region := range []string{"a", "b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := time.Now()
			for ctx.Err() == nil {
				now := time.Now()
				f := share(region, now)
				if f == 0 {
					next = now.Add(10 * time.Millisecond)
				} else {
					send(region)
					next = next.Add(time.Duration(float64(time.Second) / (offered * f)))
				}
				if d := time.Until(next); d > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(d):
					}
				} else if d < -100*time.Millisecond {
					next = time.Now() // behind: do not burst to catch up
				}
			}
		}()
	}
	defer func() { stop(); wg.Wait() }()
	// Past the coordinator's hold, both regions on half the limit: each answers with its part.
	half := fmt.Sprint(limit / 2)
	testenv.WaitFor(t, 10*time.Second+3*lease, "both regions on half the limit", func() bool {
		_, la := send("a")
		_, lb := send("b")
		return !global || la == half && lb == half
	})
	// The split starts on the next period's boundary (the fixed window's, on the epoch); a
	// bucket's, which has no boundaries, at once.
	start := time.Now().Add(100 * time.Millisecond)
	if !f.unaligned {
		start = start.Truncate(period).Add(period)
	}
	phaseMu.Lock()
	phaseAt = start
	phaseMu.Unlock()
	periods := f.split + f.after
	end := start.Add(time.Duration(periods) * period)
	time.Sleep(time.Until(end)) // the load runs; nothing to wait on but the clock
	stop()
	wg.Wait()

	rec, _, _ := regions.Read(context.Background(), cjs, "rule.per-key")
	t.Logf("%s, global %v, limit %d per %v, lease %v, renew %v; leases at the end: %+v", algorithm, global, limit, period, lease, renew, rec.Leases)
	var out []periodCount
	for w := range periods {
		from, to := start.Add(time.Duration(w)*period), start.Add(time.Duration(w+1)*period)
		c := periodCount{split: "50/50", from: from, to: to, limits: map[string]int{}}
		if w >= f.split {
			c.split = "100/0"
		}
		for _, a := range log {
			if a.at.Before(from) || !a.at.Before(to) {
				continue
			}
			c.asked++
			c.limits[a.region+"="+a.limit]++
			if a.ok && a.region == "a" {
				c.a++
			} else if a.ok {
				c.b++
			}
		}
		c.admitted = c.a + c.b
		t.Logf("period %d (%s): admitted %d (a %d, b %d) of %d asked; %.1f%% of the limit; answers by region=X-RateLimit-Limit %v",
			w+1, c.split, c.admitted, c.a, c.b, c.asked, 100*float64(c.admitted)/float64(limit), c.limits)
		out = append(out, c)
	}
	return out
}
