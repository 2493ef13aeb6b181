package ingress

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// TestOutlookShareAndRetryAfter: a tenant's share is the rate × its weight over the weights of
// the tenants with jobs waiting (the reading's, those accepted since, and itself), capped by
// tenant_rate; a refusal's Retry-After is the jobs beyond the bound over that share, plus what
// remains of a pause, in whole seconds, at least 1.
func TestOutlookShareAndRetryAfter(t *testing.T) {
	q := &config.Queue{Name: "q", Rate: config.Rate{N: 60, Per: time.Second}, Fair: true, TenantMaxDepth: 10}
	capped := *q
	capped.TenantRate = config.Rate{N: 5, Per: time.Second}
	weights := map[string]float64{"gold": 3}
	for _, tc := range []struct {
		name    string
		q       *config.Queue
		waiting map[string]uint64 // the reading's
		since   []string          // tenants accepted since the reading
		drain   Drain
		tenant  string
		depth   int64 // of the tenant, when refused
		share   float64
		retry   int64
	}{
		{name: "alone", q: q, waiting: map[string]uint64{"a": 10}, tenant: "a", depth: 10, share: 60, retry: 1},
		{name: "beside gold", q: q, waiting: map[string]uint64{"a": 10, "gold": 5}, tenant: "a", depth: 10, share: 15, retry: 1},
		{name: "gold beside two", q: q, waiting: map[string]uint64{"a": 1, "b": 1, "gold": 10}, tenant: "gold", depth: 10, share: 36, retry: 1},
		{name: "a tenant the reading missed", q: q, waiting: map[string]uint64{"gold": 5}, since: []string{"b"}, tenant: "a", depth: 10, share: 12, retry: 1},
		{name: "far beyond after a reload", q: q, waiting: map[string]uint64{"a": 130, "b": 1}, tenant: "a", depth: 130, share: 30, retry: 5},
		{name: "capped by tenant_rate", q: &capped, waiting: map[string]uint64{"a": 40}, tenant: "a", depth: 40, share: 5, retry: 7},
		{name: "runtime rate", q: q, waiting: map[string]uint64{"a": 10, "b": 1}, drain: Drain{Rate: 0.5}, tenant: "a", depth: 10, share: 0.25, retry: 4},
		{name: "paused 30s", q: q, waiting: map[string]uint64{"a": 10}, drain: Drain{PausedUntil: epoch.Add(30 * time.Second)}, tenant: "a", depth: 10, share: 60, retry: 31},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &outlook{drain: tc.drain}
			for _, s := range tc.since {
				o.inflight = inc(o.inflight, s, 1)
			}
			o.install(epoch, queue.Backlog{Tenants: tc.waiting}, tc.q, weights)
			if got := o.share(tc.q, tc.tenant); got != tc.share {
				t.Errorf("share = %v, want %v", got, tc.share)
			}
			if got := o.tenantRetryAfter(epoch, tc.q, tc.tenant, tc.depth); got != tc.retry {
				t.Errorf("Retry-After = %d, want %d", got, tc.retry)
			}
		})
	}
}

// TestOutlookWhen: jobs waiting at the reading drain from its instant (or a pause's end), the
// newer ones from now; no estimate without a recent reading, during a pause without end, or
// without a rate.
func TestOutlookWhen(t *testing.T) {
	for _, tc := range []struct {
		name               string
		at, now            time.Time
		drain              Drain
		ahead, avail, rate float64
		want               time.Duration // after epoch; -1: none
	}{
		{name: "all waited at the reading", at: epoch, now: epoch.Add(500 * time.Millisecond), ahead: 100, avail: 100, rate: 20, want: 5 * time.Second},
		{name: "an idle queue filled since", at: epoch, now: epoch.Add(900 * time.Millisecond), ahead: 200, avail: 0, rate: 20, want: 10900 * time.Millisecond},
		{name: "half then, half since", at: epoch, now: epoch.Add(time.Second), ahead: 40, avail: 20, rate: 10, want: 4 * time.Second},
		{name: "after a pause", at: epoch, now: epoch, drain: Drain{PausedUntil: epoch.Add(3 * time.Second)}, ahead: 10, avail: 10, rate: 10, want: 4 * time.Second},
		{name: "next in line", at: epoch, now: epoch.Add(200 * time.Millisecond), ahead: 0, avail: 0, rate: 10, want: 200 * time.Millisecond},
		{name: "paused without end", at: epoch, now: epoch, drain: Drain{Indefinite: true}, ahead: 1, rate: 10, want: -1},
		{name: "reading too old", at: epoch, now: epoch.Add(outlookStale), ahead: 1, rate: 10, want: -1},
		{name: "no reading", now: epoch, ahead: 1, rate: 10, want: -1},
		{name: "no rate", at: epoch, now: epoch, ahead: 1, want: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := &outlook{at: tc.at, drain: tc.drain}
			got, ok := o.when(tc.now, tc.ahead, tc.avail, tc.rate)
			switch {
			case tc.want < 0 && ok:
				t.Errorf("eta %v, want none", got)
			case tc.want >= 0 && (!ok || !got.Equal(epoch.Add(tc.want))):
				t.Errorf("eta %v (%v), want %v", got, ok, epoch.Add(tc.want))
			}
		})
	}
}
