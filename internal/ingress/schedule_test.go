package ingress

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// A direct job with Sluice-Delay or Sluice-Not-Before is accepted as scheduled, its eta its
// time, and its status says scheduled with that time.
//
// The eta is rounded to the millisecond, so it may be up to half of one past the job's time.
func TestSubmitScheduledJob(t *testing.T) {
	f := newQueueFixtureWith(t, deferYAML, func(o *Options) { o.Now = time.Now })
	for _, hdr := range [][]string{
		{"Sluice-Delay", "1h"},
		{"Sluice-Delay", "3600"},
		{"Sluice-Not-Before", time.Now().Add(time.Hour).UTC().Format(time.RFC3339)},
	} {
		before := time.Now()
		res := f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x"), hdr...)
		var a Accepted
		if res.StatusCode != http.StatusAccepted || json.NewDecoder(res.Body).Decode(&a) != nil {
			t.Fatalf("%v: status %d", hdr, res.StatusCode)
		}
		if a.State != queue.StateScheduled || a.ETA == nil || a.ETA.Before(before.Add(59*time.Minute)) || a.ETA.After(time.Now().Add(time.Hour+time.Millisecond)) {
			t.Fatalf("%v: 202 %+v", hdr, a)
		}
		st, err := f.qs.Status(f.ctx, a.ID)
		if err != nil || st.State != queue.StateScheduled || st.NotBefore == nil || !st.NotBefore.Equal(*a.ETA) && st.NotBefore.Sub(*a.ETA).Abs() > time.Millisecond {
			t.Fatalf("%v: status %+v, %v", hdr, st, err)
		}
	}
	info, err := f.qs.Info(f.ctx, "orders")
	if err != nil || info.Scheduled != 3 || info.Depth != 0 {
		t.Fatalf("info %+v, %v", info, err)
	}
}

// Malformed, repeated or conflicting schedule headers, a negative delay and a time beyond
// max_delay are refused with a 400 problem; a zero delay or a past time is an ordinary job.
func TestSubmitScheduledJobRefused(t *testing.T) {
	f := newQueueFixtureWith(t, deferYAML, func(o *Options) { o.Now = time.Now })
	for _, hdr := range [][]string{
		{"Sluice-Delay", "soon"},
		{"Sluice-Delay", "-5s"},
		{"Sluice-Delay", "1s", "Sluice-Delay", "2s"},
		{"Sluice-Delay", "1s", "Sluice-Not-Before", time.Now().Add(time.Minute).UTC().Format(time.RFC3339)},
		{"Sluice-Not-Before", "tomorrow"},
		{"Sluice-Not-Before", time.Now().Add(time.Minute).Format(time.RFC1123)},
		{"Sluice-Delay", "721h"},
		{"Sluice-Not-Before", time.Now().Add(31 * 24 * time.Hour).UTC().Format(time.RFC3339)},
	} {
		res := f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x"), hdr...)
		p := readProblem(t, res, http.StatusBadRequest)
		if p.Detail == "" {
			t.Fatalf("%v: problem without detail", hdr)
		}
	}
	for _, hdr := range [][]string{{"Sluice-Delay", "0s"}, {"Sluice-Not-Before", "2001-02-03T04:05:06Z"}} {
		res := f.do("POST", "/v1/queues/orders/jobs", strings.NewReader("x"), hdr...)
		accepted(t, res, "orders")
	}
	if info, _ := f.qs.Info(f.ctx, "orders"); info.Scheduled != 0 || info.Depth != 2 {
		t.Fatalf("info %+v: want the two ordinary jobs only", info)
	}
}

// Sluice-Priority high or low needs a queue with priorities: true (each level costs the NATS
// servers a stream and a consumer); without it the submission is refused with 400, and a
// queue with it takes them.
func TestPriorityNeedsPriorities(t *testing.T) {
	f := newQueueFixture(t, `
queues:
  - {name: plain, rate: 1/s, target: 'POST http://upstream.invalid/x'}
  - {name: levels, rate: 1/s, target: 'POST http://upstream.invalid/x', priorities: true}
`)
	pb := readProblem(t, f.do("POST", "/v1/queues/plain/jobs", strings.NewReader("x"), "Sluice-Priority", "high"), http.StatusBadRequest)
	if !strings.Contains(pb.Detail, "priorities: true") {
		t.Errorf("400 detail %q", pb.Detail)
	}
	accepted(t, f.do("POST", "/v1/queues/plain/jobs", strings.NewReader("x"), "Sluice-Priority", "normal"), "plain")
	accepted(t, f.do("POST", "/v1/queues/levels/jobs", strings.NewReader("x"), "Sluice-Priority", "low"), "levels")
	if info, err := f.qs.Info(f.ctx, "levels"); err != nil || info.Depth != 1 {
		t.Errorf("levels: info %+v, %v; want the low job counted", info, err)
	}
	if _, err := f.qs.Publish(f.ctx, &queue.Job{Queue: "plain", Direct: true, Priority: queue.PriorityHigh}); !errors.Is(err, queue.ErrNoPriorities) {
		t.Errorf("publishing a high job to a queue without levels: %v, want ErrNoPriorities", err)
	}
}
