package ingress

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// drainSource is an Options.Drain a test sets.
type drainSource struct {
	mu sync.Mutex
	d  Drain
}

func (s *drainSource) set(d Drain) { s.mu.Lock(); s.d = d; s.mu.Unlock() }
func (s *drainSource) get(context.Context, string) (Drain, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.d, nil
}

// acceptedETA submits a job to queue name as apiKey and returns its 202 body.
func (f *queueFixture) acceptedETA(t *testing.T, name, apiKey string) Accepted {
	t.Helper()
	return accepted(t, f.do("POST", "/v1/queues/"+name+"/jobs", strings.NewReader("x"), "X-API-Key", apiKey), name)
}

// statusETA reads job id's status as apiKey and returns its eta (nil: none).
func (f *queueFixture) statusETA(t *testing.T, id, apiKey string) *time.Time {
	t.Helper()
	res := f.do("GET", JobPath(id), nil, "X-API-Key", apiKey)
	body, _ := io.ReadAll(res.Body)
	var st struct {
		State queue.State `json:"state"`
		ETA   *time.Time  `json:"eta"`
	}
	if res.StatusCode != http.StatusOK || json.Unmarshal(body, &st) != nil || st.State != queue.StateQueued {
		t.Fatalf("GET %s: %d %s", id, res.StatusCode, body)
	}
	return st.ETA
}

func wantETA(t *testing.T, what string, got *time.Time, want time.Time) {
	t.Helper()
	if got == nil || !got.Equal(want) {
		t.Fatalf("%s: eta %v, want %v", what, got, want)
	}
}

// TestETAPlainQueue: the eta of a plain queue's job is the jobs before it in the stream (its
// sequence less the ack floor) over the effective rate, after a pause; the same job's status
// tells it anew on each read, as jobs leave, as the rate or a pause changes; an operator's
// pause without end leaves it out.
func TestETAPlainQueue(t *testing.T) {
	src := &drainSource{}
	f := newQueueFixtureWith(t, `
queues:
  - { name: plain, rate: 10/s, target: "POST http://127.0.0.1:1/x" }
rules:
  - { name: deferred, match: { methods: [POST], path: /later }, action: enqueue, queue: plain }
`, func(o *Options) { o.Drain = src.get })
	for range 30 {
		if _, err := f.qs.Publish(f.ctx, &queue.Job{Queue: "plain", Direct: true}); err != nil {
			t.Fatal(err)
		}
	}
	a := f.acceptedETA(t, "plain", "")
	wantETA(t, "behind 30 jobs at 10/s", a.ETA, epoch.Add(3*time.Second))
	wantETA(t, "its status", f.statusETA(t, a.ID, ""), epoch.Add(3*time.Second))
	d := accepted(t, f.do("POST", "/later", strings.NewReader("d")), "plain") // a deferred request's 202
	wantETA(t, "a deferred request behind 31", d.ETA, epoch.Add(3100*time.Millisecond))

	f.fetch(t, "plain", 10) // 10 delivered and acked
	testenv.WaitFor(t, 5*time.Second, "the ack floor at 10", func() bool {
		b, err := f.qs.Backlog(f.ctx, "plain")
		return err == nil && b.AckFloor == 10
	})
	f.clock.Advance(time.Second)
	wantETA(t, "a second later, 20 ahead", f.statusETA(t, a.ID, ""), epoch.Add(3*time.Second))

	src.set(Drain{PausedUntil: epoch.Add(6 * time.Second)})
	f.clock.Advance(time.Second)
	wantETA(t, "paused until +6s", f.statusETA(t, a.ID, ""), epoch.Add(8*time.Second))

	src.set(Drain{Rate: 20})
	f.clock.Advance(time.Second)
	wantETA(t, "at a runtime rate of 20/s", f.statusETA(t, a.ID, ""), epoch.Add(4*time.Second))

	src.set(Drain{Indefinite: true})
	f.clock.Advance(time.Second)
	if eta := f.statusETA(t, a.ID, ""); eta != nil {
		t.Fatalf("paused without end: eta %v, want none", eta)
	}
	if b := f.acceptedETA(t, "plain", ""); b.ETA != nil {
		t.Fatalf("a 202 while paused without end: eta %v, want none", b.ETA)
	}
}

// TestETAFair: in a fair queue a job's eta is its tenant's jobs before it over the tenant's
// share of the rate (its weight over the weights of the tenants with jobs waiting), and a
// waiting job's status places it among its tenant's waiting jobs.
func TestETAFair(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - name: shared
    rate: 60/m
    tenant: [header:X-API-Key]
    fair: true
    weights: { key-B: 3 }
    target: "POST http://127.0.0.1:1/x"
`)
	f.acceptedETA(t, "shared", "key-B")
	var as []Accepted
	for k := range 10 {
		a := f.acceptedETA(t, "shared", "key-A")
		// A's share while B waits too: 1/s × 1/(1+3); k of A's jobs before it.
		wantETA(t, "A's job "+itoa(int64(k+1)), a.ETA, epoch.Add(time.Duration(4*k)*time.Second))
		as = append(as, a)
	}
	// A second later (nothing moved: no worker), A's fifth job has 4 of A's 10 before it.
	f.clock.Advance(time.Second)
	wantETA(t, "A's fifth job's status", f.statusETA(t, as[4].ID, "key-A"), epoch.Add(17*time.Second))
}
