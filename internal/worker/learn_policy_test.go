package worker

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/retry"
)

// fakeAdapter records the adaptations asked for, by key, and answers a fixed rate.
type fakeAdapter struct {
	mu   sync.Mutex
	asks map[string][]leaky.Adaptation
	rate float64
}

func (f *fakeAdapter) Adapt(_ context.Context, key string, a leaky.Adaptation) (float64, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.asks == nil {
		f.asks = map[string][]leaky.Adaptation{}
	}
	f.asks[key] = append(f.asks[key], a)
	return f.rate, a.Decrease, nil
}

func (f *fakeAdapter) Learned(context.Context, string) (float64, bool, error) {
	return f.rate, true, nil
}

// kinds names each adaptation asked for key: decrease, target or increase.
func (f *fakeAdapter) kinds(key string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, a := range f.asks[key] {
		switch {
		case a.Decrease:
			out = append(out, "decrease")
		case a.Target > 0:
			out = append(out, "target")
		default:
			out = append(out, "increase")
		}
	}
	return out
}

// TestLearnersObserve: a queue's answers teach the queue's learned rate, but a tenant's job
// on a queue that learns per tenant teaches its tenant's; a 429 lowers, a 2xx with quota
// headers aims, a plain 2xx counts toward the next raise, a queue that is not adaptive learns
// nothing.
func TestLearnersObserve(t *testing.T) {
	quota := &http.Response{StatusCode: 200, Header: http.Header{"X-Ratelimit-Remaining": {"10"}, "X-Ratelimit-Reset": {"5"}}}
	adaptive := QueueConfig{Name: "q", Rate: leaky.Every(100, time.Second), Adaptive: true, MinRate: 1}
	perTenant := QueueConfig{Name: "q", Rate: leaky.Every(100, time.Second), Adaptive: true, MinRate: 1, Fair: true, PauseTenant: true}
	for _, c := range []struct {
		name            string
		cfg             QueueConfig
		tenant          string
		class           retry.Class
		resp            *http.Response
		queue, tenantAs []string
		successes       int64
	}{
		{"429 lowers the queue's", adaptive, "a", retry.Pause, nil, []string{"decrease"}, nil, 0},
		{"quota aims the queue's", adaptive, "a", retry.Success, quota, []string{"target"}, nil, 1},
		{"a plain 2xx counts", adaptive, "a", retry.Success, &http.Response{StatusCode: 200}, nil, nil, 1},
		{"a tenant's 429 lowers the tenant's", perTenant, "a", retry.Pause, nil, nil, []string{"decrease"}, 0},
		{"a tenant's quota aims the tenant's", perTenant, "a", retry.Success, quota, nil, []string{"target"}, 0},
		{"no tenant: the queue's", perTenant, "", retry.Pause, nil, nil, nil, 0},
		{"not adaptive", QueueConfig{Name: "q", Rate: leaky.Every(100, time.Second)}, "a", retry.Pause, nil, nil, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			ad := &fakeAdapter{rate: 50}
			env := testEnv("q", func() *QueueConfig { return &c.cfg })
			l, ts := &learner{env: env, ad: ad}, &tenantLearners{env: env, ad: ad}
			a := answer{resp: c.resp, class: c.class}
			j := testJob("j", c.tenant)
			l.observe(&c.cfg, j, a)
			ts.observe(&c.cfg, j, a)
			if got := ad.kinds("q"); !slices.Equal(got, c.queue) {
				t.Errorf("queue's adaptations %v, want %v", got, c.queue)
			}
			if got := ad.kinds("q/t/a"); !slices.Equal(got, c.tenantAs) {
				t.Errorf("tenant's adaptations %v, want %v", got, c.tenantAs)
			}
			if got := l.successes.Load(); got != c.successes {
				t.Errorf("queue's successes %d, want %d", got, c.successes)
			}
		})
	}
}

// TestLearnerRun: the loop raises the learned rate by what the successes since earned, and the
// leak slot reads the shared value it gets back.
func TestLearnerRun(t *testing.T) {
	cfg := QueueConfig{Name: "q", Rate: leaky.Every(100, time.Second), Adaptive: true, MinRate: 1}
	ad := &fakeAdapter{rate: 40}
	l := &learner{env: testEnv("q", func() *QueueConfig { return &cfg }), ad: ad}
	l.successes.Store(10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "the learned rate back from the schedule", func() bool { return l.rate() == 40 })
	cancel()
	<-done
	ad.mu.Lock()
	first := ad.asks["q"][0]
	ad.mu.Unlock()
	// 10 successes in a round at 100/s: a tenth of the most a round may raise.
	if want := adaptIncrease * 100 * 10 / (100 * adaptEvery.Seconds()); first.Increase != want || first.Ceiling != 100 {
		t.Fatalf("first round asked %+v, want increase %v under a ceiling of 100", first, want)
	}
	if l.successes.Load() != 0 {
		t.Fatal("the round kept its successes")
	}
}

// TestUnitLearnerObserve: only an adaptive unit queue's successful answers teach its unit rate.
func TestUnitLearnerObserve(t *testing.T) {
	budget := leaky.Units{N: 90000, Per: time.Minute}
	tokens := &http.Response{StatusCode: 200, Header: http.Header{"X-Ratelimit-Limit-Tokens": {"30000"}}}
	for _, c := range []struct {
		name  string
		cfg   QueueConfig
		class retry.Class
		resp  *http.Response
		want  int64
	}{
		{"adaptive unit queue", QueueConfig{Adaptive: true, Units: budget}, retry.Success, tokens, 30000},
		{"not adaptive", QueueConfig{Units: budget}, retry.Success, tokens, 90000},
		{"no units", QueueConfig{Adaptive: true}, retry.Success, tokens, 90000},
		{"a failure", QueueConfig{Adaptive: true, Units: budget}, retry.Retry, tokens, 90000},
		{"no answer", QueueConfig{Adaptive: true, Units: budget}, retry.Success, nil, 90000},
	} {
		u := &unitLearner{now: time.Now}
		u.observe(&c.cfg, testJob("j", ""), answer{resp: c.resp, class: c.class})
		if got := u.units(budget, time.Now()); got.N != c.want {
			t.Errorf("%s: %d units a minute, want %d", c.name, got.N, c.want)
		}
	}
}

// TestLearnedRateSurvivesRedisRestart: a rate the upstream pushed down stays down after
// redis-server is killed and restarted without persistence: the worker's next round puts back
// what it learned, instead of the schedule starting again at the ceiling.
func TestLearnedRateSurvivesRedisRestart(t *testing.T) {
	rs := testenv.Redis(t)
	ad := leaky.NewRedis(rs.Client, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"})
	cfg := QueueConfig{Name: "q", Rate: leaky.Every(100, time.Second), Adaptive: true, MinRate: 1}
	clock := newFakeClock()
	env := testEnv("q", func() *QueueConfig { return &cfg })
	env.now = clock.now
	l := &learner{env: env, ad: ad}
	l.observe(&cfg, testJob("j", ""), answer{class: retry.Pause}) // 100 → 80
	learned := l.rate()
	if learned != 80 {
		t.Fatalf("learned %v after a push-back, want 80", learned)
	}
	if err := rs.Client.Set(context.Background(), "sentinel", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	rs.Stop()
	rs.Start()
	if n, _ := rs.Client.Exists(context.Background(), "sentinel").Result(); n != 0 {
		t.Fatal("the restart kept the data; the test needs it lost")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	testenv.WaitFor(t, 5*time.Second, "a round against the restarted schedule", func() bool {
		eff, ok, err := ad.Learned(context.Background(), "q")
		return err == nil && ok && eff > 0
	})
	cancel()
	<-done
	eff, _, _ := ad.Learned(context.Background(), "q")
	if eff > learned+2*adaptIncrease*100*adaptEvery.Seconds()+1e-9 {
		t.Fatalf("after the restart the schedule learned %v, want at most %v plus two rounds' raise (not the ceiling 100)", eff, learned)
	}
}
