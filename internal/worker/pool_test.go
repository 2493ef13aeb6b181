package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

var testBackoff = retry.Policy{Initial: 50 * time.Millisecond, Max: 400 * time.Millisecond}

// A deferred request is replayed with its method, path, query, headers and body to the
// upstream; a direct job goes to the queue's target with its body and Content-Type only. Both
// carry Sluice-Job, Sluice-Attempt and Idempotency-Key: the client's own key when it sent
// one, the job id otherwise. A client's own Sluice-* headers are not passed on.
func TestDeliveryRequests(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "deferred"}, queue.Spec{Name: "direct"})
	body := []byte("binary\x00body\xff")
	deferred, err := h.qs.Publish(h.ctx, &queue.Job{
		Queue:  "deferred",
		Method: http.MethodPatch,
		Path:   "/api/v1/orders?id=7&x=a%20b",
		Header: http.Header{
			"Content-Type":      {"application/octet-stream"},
			"X-Custom":          {"a"},
			"X-Multi":           {"1", "2"},
			"Connection":        {"X-Hop"},
			"X-Hop":             {"dropped: named by Connection"},
			"Transfer-Encoding": {"chunked"},
			"Idempotency-Key":   {"order-12812"},
			"Sluice-Attempt":    {"99"},
			"Sluice-Job":        {"forged"},
			"Sluice-Custom":     {"x"},
		},
		IdempotencyKey: "order-12812",
		Body:           body,
	})
	if err != nil {
		t.Fatal(err)
	}
	direct, err := h.qs.Publish(h.ctx, &queue.Job{
		Queue:  "direct",
		Direct: true,
		Header: http.Header{"Content-Type": {"application/x-thing"}, "X-Not-Forwarded": {"v"}},
		Body:   []byte(`{"n":1}`),
	})
	if err != nil {
		t.Fatal(err)
	}

	d := h.spec("deferred", 100)
	d.Upstream = h.up.URL + "/base/"
	dir := h.spec("direct", 100)
	dir.Target = &worker.Target{Method: http.MethodPut, URL: h.up.URL + "/target/x?k=v"}
	r := h.run(worker.Deps{}, d, dir)
	h.up.WaitCount(t, 10*time.Second, "both deliveries", func(n int) bool { return n >= 2 })
	h.waitState(deferred.ID, queue.StateSucceeded, 5*time.Second)
	st := h.waitState(direct.ID, queue.StateSucceeded, 5*time.Second)
	if st.Attempts != 1 || st.Response == nil || st.Response.Status != 200 || st.LastError != "" {
		t.Errorf("direct job status = %+v, want attempts 1, response 200, no error", st)
	}

	byID := map[string]workertest.Arrival{}
	for _, a := range h.up.Arrivals() {
		byID[a.ID] = a
	}
	a, ok := byID[deferred.ID]
	if !ok {
		t.Fatalf("deferred job %s not delivered with its id as Sluice-Job", deferred.ID)
	}
	if a.Method != http.MethodPatch || a.URI != "/base/api/v1/orders?id=7&x=a%20b" {
		t.Errorf("deferred: %s %s, want PATCH /base/api/v1/orders?id=7&x=a%%20b", a.Method, a.URI)
	}
	if !bytes.Equal(a.Body, body) {
		t.Errorf("deferred body = %q, want %q", a.Body, body)
	}
	for k, want := range map[string][]string{
		"Content-Type": {"application/octet-stream"}, "X-Custom": {"a"}, "X-Multi": {"1", "2"},
		"Idempotency-Key": {"order-12812"}, "Sluice-Job": {deferred.ID}, "Sluice-Attempt": {"1"},
		"Sluice-Custom": nil,
	} {
		if got := a.Header.Values(k); !slices.Equal(got, want) {
			t.Errorf("deferred header %s = %q, want %q", k, got, want)
		}
	}
	for _, k := range []string{"X-Hop", "Transfer-Encoding"} {
		if v := a.Header.Get(k); v != "" {
			t.Errorf("deferred header %s = %q, want it dropped (hop-by-hop)", k, v)
		}
	}

	a, ok = byID[direct.ID]
	if !ok {
		t.Fatalf("direct job %s not delivered", direct.ID)
	}
	if a.Method != http.MethodPut || a.URI != "/target/x?k=v" || string(a.Body) != `{"n":1}` {
		t.Errorf("direct: %s %s %q, want PUT /target/x?k=v {\"n\":1}", a.Method, a.URI, a.Body)
	}
	if a.Header.Get("Content-Type") != "application/x-thing" || a.Header.Get("X-Not-Forwarded") != "" ||
		a.Header.Get("Idempotency-Key") != direct.ID || a.Header.Get("Sluice-Job") != direct.ID ||
		a.Header.Get("Sluice-Attempt") != "1" {
		t.Errorf("direct headers = %v", a.Header)
	}
	// The queue layer's count of ticket releases that fell back to deletion is exported.
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool { return mf.GetName() == "sluice_ticket_release_fallbacks_total" }) {
		t.Error("sluice_ticket_release_fallbacks_total is not registered")
	}
}

// A first delivery that outlasts runningAfter is recorded as running with its attempt while
// the request is out: the upstream holds the request until the status says so. Once the job
// succeeded, its ack (sent without waiting for a confirmation) has reached the server: the
// job is neither in the queue nor in flight.
func TestSlowDeliveryRecordedRunning(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	release := make(chan struct{})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply { return workertest.Reply{Block: release} })
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	h.run(worker.Deps{}, h.spec("q", 100))
	h.up.WaitCount(t, 10*time.Second, "the delivery", func(n int) bool { return n >= 1 })
	if st := h.waitState(ids[0], queue.StateRunning, 10*time.Second); st.Attempts != 1 {
		t.Errorf("running status = %+v, want attempts 1", st)
	}
	close(release)
	if st := h.waitState(ids[0], queue.StateSucceeded, 10*time.Second); st.Attempts != 1 {
		t.Errorf("final status = %+v, want attempts 1", st)
	}
	testenv.WaitFor(t, 10*time.Second, "the job to be acked", func() bool {
		in := h.info("q")
		return in.Depth == 0 && in.InFlight == 0
	})
	if n := h.up.Count(); n != 1 {
		t.Errorf("upstream saw %d deliveries, want 1", n)
	}
}

// A first delivery shorter than runningAfter is not recorded as running (here runningAfter is
// an hour: the status stays queued while the request is out), but a redelivery is, at once:
// had its worker died mid-delivery, the attempt would still count, so a job that kills its
// workers cannot be retried for ever. The delivery that fetchAndNak took left no record, as a
// worker that died after sending would not: it counts as an attempt the upstream may have seen,
// so the redelivery is attempt 2, in its status and its Sluice-Attempt.
func TestRedeliveryRecordedRunningAtOnce(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	again := workertest.Publish(t, h.qs, "q", 1, true)[0]
	h.fetchAndNak("q")
	first := workertest.Publish(t, h.qs, "q", 1, true)[0]
	release := make(chan struct{})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply { return workertest.Reply{Block: release} })
	h.runWith(worker.Deps{}, func(p *worker.Pool) { worker.SetRunningAfter(p, time.Hour) }, h.spec("q", 100))
	h.up.WaitCount(t, 10*time.Second, "both deliveries", func(n int) bool { return n >= 2 })
	if st := h.waitState(again, queue.StateRunning, 10*time.Second); st.Attempts != 2 {
		t.Errorf("redelivered job's status = %+v, want running with attempts 2", st)
	}
	if st := h.status(first); st.State != queue.StateQueued || st.Attempts != 0 {
		t.Errorf("first delivery's status while the request is out = %+v, want queued, attempts 0", st)
	}
	close(release)
	want := map[string]int{again: 2, first: 1}
	for id, n := range want {
		if st := h.waitState(id, queue.StateSucceeded, 10*time.Second); st.Attempts != n {
			t.Errorf("job %s: final status = %+v, want attempts %d", id, st, n)
		}
	}
	for _, a := range h.up.Arrivals() {
		if a.Attempt != want[a.ID] {
			t.Errorf("job %s sent with Sluice-Attempt %d, want %d", a.ID, a.Attempt, want[a.ID])
		}
	}
}

// TestHandBackIsNotAnAttempt: a job handed back at shutdown before it was sent is not counted
// as an attempt by its next delivery.
func TestHandBackIsNotAnAttempt(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	ids := workertest.Publish(t, h.qs, "q", 3, true)
	r := h.run(worker.Deps{}, h.spec("q", 1)) // 1/s: the second and third wait for slots
	h.up.WaitCount(t, 10*time.Second, "the first delivery", func(n int) bool { return n >= 1 })
	r.stop(t)
	h.run(worker.Deps{}, h.spec("q", 100))
	for _, id := range ids {
		if st := h.waitState(id, queue.StateSucceeded, 15*time.Second); st.Attempts != 1 {
			t.Errorf("job %s: attempts %d, want 1 (a hand-back before sending is no attempt)", id, st.Attempts)
		}
	}
	for _, a := range h.up.Arrivals() {
		if a.Attempt != 1 {
			t.Errorf("job %s sent with Sluice-Attempt %d, want 1", a.ID, a.Attempt)
		}
	}
}

// While jobs in hand wait for their slots, the pool fetches in batches; but when every job in
// hand is being delivered (a slow upstream, not the rate, holds the queue back), it fetches
// for each place that frees up, so Concurrency deliveries stay in flight.
func TestSlowUpstreamKeepsConcurrencyInFlight(t *testing.T) {
	const concurrency, n = 8, 12
	h := newHarness(t, queue.Spec{Name: "q"})
	var releases [n + 1]chan struct{}
	for i := range releases {
		releases[i] = make(chan struct{})
	}
	arrived := map[string]int{} // job id -> order of arrival, from 0
	var mu sync.Mutex
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		mu.Lock()
		defer mu.Unlock()
		if _, ok := arrived[a.ID]; !ok {
			arrived[a.ID] = len(arrived)
		}
		return workertest.Reply{Block: releases[arrived[a.ID]]}
	})
	workertest.Publish(t, h.qs, "q", n, true)
	spec := h.spec("q", 1000)
	spec.Concurrency = concurrency
	spec.Timeout = time.Minute // no delivery ends but the released one
	h.run(worker.Deps{}, spec)
	t.Cleanup(func() { // before the pool's cleanup stops it
		for _, c := range releases[1:] {
			close(c)
		}
	})
	h.up.WaitCount(t, 10*time.Second, "Concurrency deliveries", func(k int) bool { return k >= concurrency })
	close(releases[0])
	h.up.WaitCount(t, 10*time.Second, "a delivery in the freed place", func(k int) bool { return k >= concurrency+1 })
	if k := h.up.Count(); k != concurrency+1 {
		t.Errorf("%d deliveries with one of %d finished, want %d", k, concurrency, concurrency+1)
	}
}

// A job the upstream always fails with 500 is tried MaxAttempts times, spaced by the backoff
// policy, then dead-lettered with its last status and error.
func TestPoisonJobDeadLetteredAfterMaxAttempts(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply {
		return workertest.Reply{Status: http.StatusInternalServerError}
	})
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	spec := h.spec("q", 100)
	spec.MaxAttempts = 4
	spec.Backoff = retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second}
	r := h.run(worker.Deps{}, spec)

	st := h.waitState(ids[0], queue.StateFailed, 15*time.Second)
	if st.Attempts != 4 || !st.DeadLetter || st.Response == nil || st.Response.Status != 500 ||
		!strings.Contains(st.LastError, "500") {
		t.Errorf("status = %+v, want failed after 4 attempts, dead letter, response 500, last_error naming 500", st)
	}
	arrivals := h.up.Arrivals()
	if len(arrivals) != 4 {
		t.Fatalf("upstream saw %d deliveries, want 4", len(arrivals))
	}
	for i, a := range arrivals {
		if a.Attempt != i+1 {
			t.Errorf("delivery %d: Sluice-Attempt %d, want %d", i, a.Attempt, i+1)
		}
		if i == 0 {
			continue
		}
		// After attempt i the job waits Delay(i, rnd) ∈ [d(1-j), d(1+j)], d = 100ms·2^(i-1).
		gap := a.At.Sub(arrivals[i-1].At)
		low := spec.Backoff.Delay(i, 0)
		high := spec.Backoff.Delay(i, 1) + time.Second // plus redelivery and slot latency
		if gap < low || gap > high {
			t.Errorf("gap before attempt %d = %v, want in [%v, %v]", i+1, gap, low, high)
		}
	}
	dls, err := h.qs.DeadLetters(h.ctx, "q", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Job.ID != ids[0] || dls[0].LastStatus != 500 || dls[0].Attempts != 4 ||
		!strings.HasPrefix(dls[0].Reason, "max_attempts") {
		t.Errorf("dead letters = %+v, want the job with last status 500, 4 attempts, reason max_attempts", dls)
	}
	if got := metric(t, r.reg, "sluice_dead_letters_total", "queue", "q", "reason", "max_attempts"); got != 1 {
		t.Errorf("sluice_dead_letters_total{reason=max_attempts} = %v, want 1", got)
	}
	if got := metric(t, r.reg, "sluice_deliveries_total", "queue", "q", "outcome", "retry"); got != 4 {
		t.Errorf("sluice_deliveries_total{outcome=retry} = %v, want 4", got)
	}
}

// Other 4xx are permanent: one delivery, then the dead-letter queue.
func TestClientErrorDeadLetteredAtOnce(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply {
		return workertest.Reply{Status: http.StatusUnprocessableEntity}
	})
	ids := workertest.Publish(t, h.qs, "q", 1, false)
	r := h.run(worker.Deps{}, h.spec("q", 100))
	st := h.waitState(ids[0], queue.StateFailed, 10*time.Second)
	if st.Attempts != 1 || st.Response == nil || st.Response.Status != 422 || !st.DeadLetter {
		t.Errorf("status = %+v, want failed after 1 attempt with response 422", st)
	}
	if n := h.up.Count(); n != 1 {
		t.Errorf("upstream saw %d deliveries, want 1", n)
	}
	if in := h.info("q"); in.DeadLetters != 1 || in.Depth != 0 {
		t.Errorf("queue info = %+v, want depth 0 and 1 dead letter", in)
	}
	if got := metric(t, r.reg, "sluice_dead_letters_total", "queue", "q", "reason", "permanent"); got != 1 {
		t.Errorf("sluice_dead_letters_total{reason=permanent} = %v, want 1", got)
	}
}

// 429 and 503 pause the queue and retry the job without spending an attempt: with
// MaxAttempts 1 the job still succeeds on its third delivery, all of them attempt 1.
func TestPauseRetriesDoNotSpendAttempts(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	h.up.Respond(func(_ workertest.Arrival, nth int) workertest.Reply {
		switch nth {
		case 1:
			return workertest.Reply{Status: http.StatusTooManyRequests}
		case 2:
			return workertest.Reply{Status: http.StatusServiceUnavailable}
		}
		return workertest.Reply{Status: http.StatusOK}
	})
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	spec := h.spec("q", 100)
	spec.MaxAttempts = 1
	spec.DefaultPause = 200 * time.Millisecond
	r := h.run(worker.Deps{}, spec)

	st := h.waitState(ids[0], queue.StateSucceeded, 10*time.Second)
	if st.Attempts != 1 {
		t.Errorf("attempts = %d, want 1: pause retries spend none", st.Attempts)
	}
	arrivals := h.up.Arrivals()
	if len(arrivals) != 3 {
		t.Fatalf("upstream saw %d deliveries, want 3", len(arrivals))
	}
	for i, a := range arrivals {
		if a.Attempt != 1 {
			t.Errorf("delivery %d: Sluice-Attempt %d, want 1", i, a.Attempt)
		}
		if i > 0 {
			if gap := a.At.Sub(arrivals[i-1].At); gap < spec.DefaultPause {
				t.Errorf("delivery %d came %v after a 429/503, want ≥ the %v pause", i, gap, spec.DefaultPause)
			}
		}
	}
	if got := metric(t, r.reg, "sluice_queue_pauses_total", "queue", "q"); got != 2 {
		t.Errorf("sluice_queue_pauses_total = %v, want 2", got)
	}
}

// A job the upstream keeps throttling is dead-lettered after MaxPauseRetries pause retries.
func TestPauseRetriesBounded(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply {
		return workertest.Reply{Status: http.StatusTooManyRequests, Header: http.Header{"Retry-After": {"0"}}}
	})
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	spec := h.spec("q", 100)
	spec.MaxPauseRetries = 2
	r := h.run(worker.Deps{}, spec)
	st := h.waitState(ids[0], queue.StateFailed, 10*time.Second)
	if n := h.up.Count(); n != 3 {
		t.Errorf("upstream saw %d deliveries, want 3 (the first and 2 pause retries)", n)
	}
	if st.Response == nil || st.Response.Status != 429 || !strings.Contains(st.LastError, "pause retries") {
		t.Errorf("status = %+v, want failed with response 429 and a last_error about pause retries", st)
	}
	if got := metric(t, r.reg, "sluice_dead_letters_total", "queue", "q", "reason", "max_pause_retries"); got != 1 {
		t.Errorf("sluice_dead_letters_total{reason=max_pause_retries} = %v, want 1", got)
	}
}

// A delivery that outlives Timeout is a retryable failure; the next attempt succeeds.
func TestTimeoutRetried(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	h.up.Respond(func(_ workertest.Arrival, nth int) workertest.Reply {
		if nth == 1 {
			return workertest.Reply{Block: never}
		}
		return workertest.Reply{}
	})
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	spec := h.spec("q", 100)
	spec.Timeout = 300 * time.Millisecond
	r := h.run(worker.Deps{}, spec)
	st := h.waitState(ids[0], queue.StateSucceeded, 10*time.Second)
	if st.Attempts != 2 {
		t.Errorf("attempts = %d, want 2", st.Attempts)
	}
	arrivals := h.up.Arrivals()
	if len(arrivals) != 2 || arrivals[0].Attempt != 1 || arrivals[1].Attempt != 2 {
		t.Fatalf("arrivals = %d (%+v), want attempts 1 then 2", len(arrivals), arrivals)
	}
	if gap := arrivals[1].At.Sub(arrivals[0].At); gap < spec.Timeout {
		t.Errorf("second attempt %v after the first, want ≥ the %v timeout", gap, spec.Timeout)
	}
	if got := metric(t, r.reg, "sluice_deliveries_total", "queue", "q", "outcome", "retry"); got != 1 {
		t.Errorf("sluice_deliveries_total{outcome=retry} = %v, want 1", got)
	}
}

// A redelivered job whose status is already succeeded (its worker died before the ack) is
// acked without a second delivery.
func TestRedeliveredFinalJobNotDeliveredAgain(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	if err := h.qs.SetStatus(h.ctx, queue.Status{ID: ids[0], Queue: "q", State: queue.StateSucceeded, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	h.fetchAndNak("q")
	r := h.run(worker.Deps{}, h.spec("q", 100))
	testenv.WaitFor(t, 10*time.Second, "the job to be acked", func() bool {
		return metric(t, r.reg, "sluice_redeliveries_skipped_total", "queue", "q") == 1 && h.info("q").Depth == 0
	})
	if n := h.up.Count(); n != 0 {
		t.Errorf("upstream saw %d deliveries, want 0", n)
	}
}

// A job that waits for its slot longer than AckWait is kept alive with InProgress: it is not
// redelivered, so every job arrives exactly once.
func TestJobsWaitingForSlotsKeptAlive(t *testing.T) {
	const ackWait = time.Second
	h := newHarness(t, queue.Spec{Name: "q", AckWait: ackWait})
	ids := workertest.Publish(t, h.qs, "q", 6, true)
	spec := h.spec("q", 2) // 500ms apart: the 4th job held waits 1.5s, beyond AckWait
	spec.AckWait = ackWait
	r := h.run(worker.Deps{}, spec)
	h.waitState(ids[len(ids)-1], queue.StateSucceeded, 10*time.Second)
	for _, id := range ids {
		h.waitState(id, queue.StateSucceeded, 5*time.Second)
	}
	// A job JetStream redelivered meanwhile would now be held again, waiting for a later
	// slot, and be handed back at the stop; or it would have been skipped as final.
	r.stop(t)
	for _, m := range []string{"sluice_jobs_handed_back_total", "sluice_redeliveries_skipped_total"} {
		if got := metric(t, r.reg, m, "queue", "q"); got != 0 {
			t.Errorf("%s = %v, want 0: a job held past AckWait was redelivered", m, got)
		}
	}
	for id, n := range h.up.PerID() {
		if n != 1 {
			t.Errorf("job %s delivered %d times, want once", id, n)
		}
	}
	if n := h.up.Count(); n != len(ids) {
		t.Errorf("upstream saw %d deliveries, want %d", n, len(ids))
	}
}

// On cancel the pool hands back the jobs waiting for slots at once; another pool delivers
// them, and nothing is delivered twice.
func TestShutdownHandsBackWaitingJobs(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	ids := workertest.Publish(t, h.qs, "q", 8, true)
	spec := h.spec("q", 4) // 250ms apart: most of the 4 jobs held wait when cancelled
	a := h.run(worker.Deps{}, spec)
	h.up.WaitCount(t, 10*time.Second, "a first delivery", func(n int) bool { return n >= 1 })
	if took := a.stop(t); took > 2*time.Second {
		t.Errorf("shutdown took %v with no delivery in flight, want < 2s", took)
	}
	if got := metric(t, a.reg, "sluice_jobs_handed_back_total", "queue", "q"); got < 1 {
		t.Errorf("sluice_jobs_handed_back_total = %v, want ≥ 1", got)
	}
	// The jobs A held come back at once, not after the 30s AckWait.
	spec.Rate = leaky.Every(100, time.Second)
	h.run(worker.Deps{}, spec)
	h.up.WaitCount(t, 10*time.Second, "every job", func(n int) bool { return n >= len(ids) })
	for _, id := range ids {
		h.waitState(id, queue.StateSucceeded, 5*time.Second)
	}
	if n, d := h.up.Count(), h.up.Distinct(); n != len(ids) || d != len(ids) {
		t.Errorf("%d deliveries of %d jobs, want %d of %d", n, d, len(ids), len(ids))
	}
}

// A delivery in flight at shutdown is allowed to finish within the shutdown timeout.
func TestShutdownLetsDeliveryFinish(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	release := make(chan struct{})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply { return workertest.Reply{Block: release} })
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	r := h.run(worker.Deps{ShutdownTimeout: 10 * time.Second}, h.spec("q", 100))
	h.up.WaitCount(t, 10*time.Second, "the delivery", func(n int) bool { return n >= 1 })
	r.cancel()
	select {
	case <-r.done:
		t.Fatal("Run returned while a delivery was in flight")
	default:
	}
	close(release)
	r.stop(t)
	if st := h.status(ids[0]); st.State != queue.StateSucceeded {
		t.Errorf("state = %s, want succeeded", st.State)
	}
	// The ack went without waiting for its confirmation (the status was final first), so
	// the server applies it a moment after Run returned.
	testenv.WaitFor(t, 5*time.Second, "depth 0 (the job acked)", func() bool { return h.info("q").Depth == 0 })
}

// A delivery still in flight when the shutdown timeout passes is cut short and handed back;
// its attempt stays spent, and the next worker sends attempt 2.
func TestShutdownTimeoutCutsDeliveryShort(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	h.up.Respond(func(_ workertest.Arrival, nth int) workertest.Reply {
		if nth == 1 {
			return workertest.Reply{Block: never}
		}
		return workertest.Reply{}
	})
	ids := workertest.Publish(t, h.qs, "q", 1, true)
	spec := h.spec("q", 100)
	spec.Timeout = time.Minute
	r := h.run(worker.Deps{ShutdownTimeout: 300 * time.Millisecond}, spec)
	h.up.WaitCount(t, 10*time.Second, "the delivery", func(n int) bool { return n >= 1 })
	took := r.stop(t)
	if took < 300*time.Millisecond || took > 3*time.Second {
		t.Errorf("shutdown took %v, want the 300ms timeout (and not much more)", took)
	}
	st := h.status(ids[0])
	if st.State != queue.StateRetrying || st.Attempts != 1 || !strings.Contains(st.LastError, "shutdown") {
		t.Errorf("status = %+v, want retrying after 1 attempt, interrupted by shutdown", st)
	}
	h.run(worker.Deps{}, spec)
	st = h.waitState(ids[0], queue.StateSucceeded, 10*time.Second)
	arrivals := h.up.Arrivals()
	if st.Attempts != 2 || len(arrivals) != 2 || arrivals[1].Attempt != 2 {
		t.Errorf("attempts = %d, arrivals = %d, want attempt 2 delivered second", st.Attempts, len(arrivals))
	}
}

// With NATS gone, a shutdown still keeps its timeout: deliveries in flight are cut short when
// it passes, and the calls that would settle them are abandoned applyGrace (1s) later
// instead of each waiting out its own 5s timeout; the jobs come back after their AckWait.
func TestShutdownTimeoutHoldsWhileNATSIsDown(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply { return workertest.Reply{Block: never} })
	workertest.Publish(t, h.qs, "q", 3, true)
	spec := h.spec("q", 100)
	spec.Timeout = time.Minute
	r := h.run(worker.Deps{ShutdownTimeout: 300 * time.Millisecond}, spec)
	h.up.WaitCount(t, 10*time.Second, "three deliveries in flight", func(n int) bool { return n >= 3 })
	h.nats.Server.Shutdown()
	took := r.stop(t)
	if took < 300*time.Millisecond || took > 300*time.Millisecond+time.Second+700*time.Millisecond {
		t.Errorf("shutdown took %v with NATS down, want the 300ms timeout plus at most the 1s grace", took)
	}
	if got := metric(t, r.reg, "sluice_deliveries_total", "queue", "q", "outcome", "interrupted"); got != 3 {
		t.Errorf("interrupted deliveries = %v, want 3", got)
	}
}

// A worker whose leak schedule (Redis) cannot be reached does not sit on its jobs: within
// storeGiveUp (2s) it hands them back, for a worker that can reach its schedule to deliver
// long before their AckWait, reports not ready, and fetches none; once Redis answers again it
// is ready again by itself.
func TestScheduleDownHandsJobsBack(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q", AckWait: time.Minute})
	rs := testenv.Redis(t)
	rdb := rs.NewClient()
	t.Cleanup(func() { rdb.Close() })
	ids := workertest.Publish(t, h.qs, "q", 4, true)
	rs.Stop()
	a := h.run(worker.Deps{Schedule: leaky.NewRedis(rdb, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"})}, h.spec("q", 100))
	testenv.WaitFor(t, 10*time.Second, "worker A to hold the jobs", func() bool { return h.info("q").InFlight == 4 })
	testenv.WaitFor(t, 10*time.Second, "worker A to report its schedule down", func() bool {
		return errors.Is(a.Ready(), worker.ErrScheduleDown)
	})
	// Worker B reaches its schedule; the jobs come to it at once, not after A's AckWait.
	h.run(worker.Deps{}, h.spec("q", 100))
	h.up.WaitCount(t, 15*time.Second, "every job, from worker B", func(n int) bool { return n >= len(ids) })
	if got := metric(t, a.reg, "sluice_jobs_handed_back_total", "queue", "q"); got < 4 {
		t.Errorf("worker A handed back %v jobs, want ≥ 4", got)
	}
	if got := metric(t, a.reg, "sluice_deliveries_total", "queue", "q", "outcome", "success"); got != 0 {
		t.Errorf("worker A delivered %v jobs with no leak schedule, want 0", got)
	}
	for _, id := range ids {
		if st := h.waitState(id, queue.StateSucceeded, 5*time.Second); st.Attempts != 1 {
			t.Errorf("job %s: %d attempts, want 1 (hand-backs spend none)", id, st.Attempts)
		}
	}
	rs.Start()
	testenv.WaitFor(t, 15*time.Second, "worker A ready again", func() bool { return a.Ready() == nil })
}

// preFinal publishes a job whose status already says succeeded, as if a worker had delivered
// it before NATS restarted and handed it out again, its delivery count forgotten (Delivered 1).
func (h *harness) preFinal(name string) string {
	h.t.Helper()
	id := queue.NewJobID(name)
	if err := h.qs.SetStatus(h.ctx, queue.Status{ID: id, Queue: name, State: queue.StateSucceeded,
		Attempts: 1, Delivered: 1, CreatedAt: time.Now()}); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.qs.Publish(h.ctx, &queue.Job{ID: id, Queue: name, Direct: true, Body: []byte("again")}); err != nil {
		h.t.Fatal(err)
	}
	return id
}

// A worker that starts (NATS may have restarted with it) or whose connection to NATS has
// reconnected reads the record of first deliveries for a while: a job whose record is final is
// acked, not delivered again, though JetStream hands it out as a first delivery (issue 30,
// item 13). Outside that window a first delivery reads nothing, as before.
func TestFirstDeliveryAfterReconnectReadsItsRecord(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	atStart := h.preFinal("q")
	r := h.runWith(worker.Deps{}, func(p *worker.Pool) { worker.SetSuspicion(p, 500*time.Millisecond) }, h.spec("q", 100))
	testenv.WaitFor(t, 10*time.Second, "the job final at start to be skipped", func() bool {
		return metric(t, r.reg, "sluice_redeliveries_skipped_total", "queue", "q") >= 1
	})

	// Once the window has passed, a first delivery is not read: such a job is delivered.
	quiet := time.Now().Add(time.Second)
	testenv.WaitFor(t, 5*time.Second, "the start's window to pass", func() bool { return time.Now().After(quiet) })
	unread := h.preFinal("q")
	h.up.WaitCount(t, 10*time.Second, "the job published outside the window", func(n int) bool { return n >= 1 })

	nc := h.js.Conn()
	before := nc.Stats().Reconnects
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "the connection to reconnect", func() bool {
		return nc.Stats().Reconnects > before && nc.IsConnected()
	})
	afterReconnect := h.preFinal("q")
	testenv.WaitFor(t, 10*time.Second, "the job final after the reconnect to be skipped", func() bool {
		return metric(t, r.reg, "sluice_redeliveries_skipped_total", "queue", "q") >= 2
	})
	// A fetch that a loaded server answers after the worker stopped waiting for it leaves its
	// job pending until AckWait; the job then comes back, as a redelivery, and is skipped too.
	testenv.WaitFor(t, config.DefaultAckWait+5*time.Second, "the queue to be empty", func() bool { return h.info("q").Depth == 0 })
	ids := map[string]bool{}
	for _, a := range h.up.Arrivals() {
		ids[a.ID] = true
	}
	if ids[atStart] || ids[afterReconnect] || !ids[unread] || len(ids) != 1 {
		t.Errorf("delivered %v; want only %s (outside the window), not %s (start) nor %s (after the reconnect)",
			ids, unread, atStart, afterReconnect)
	}
}

// The records a worker reads before delivering (here: every first delivery, in the window
// after its start) are read in one batched direct get per fetch, not one read per job: the
// server sees multi_last requests naming every job and no single-key reads, and the jobs
// whose records are final are still skipped.
func TestRecordsReadPerFetch(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	watch := testenv.Connect(t, h.nats.URL)
	gets := make(chan *nats.Msg, 256) // the direct gets of any stream: the status bucket's, here
	if _, err := watch.ChanSubscribe("$JS.API.DIRECT.GET.>", gets); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	final := map[string]bool{}
	for range 6 {
		final[h.preFinal("q")] = true
	}
	fresh := workertest.Publish(t, h.qs, "q", 6, true)
	h.run(worker.Deps{}, h.spec("q", 100))
	h.up.WaitCount(t, 10*time.Second, "the fresh jobs", func(n int) bool { return n >= len(fresh) })
	testenv.WaitFor(t, 10*time.Second, "the queue to be empty", func() bool { return h.info("q").Depth == 0 })
	// The server queued every copy of the reads to watch before it answers this ping.
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}

	named, single := map[string]bool{}, 0
	for len(gets) > 0 {
		m := <-gets
		if strings.Contains(m.Subject, ".$KV.") { // a read of one key
			single++
			continue
		}
		var req struct {
			MultiLast []string `json:"multi_last"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Fatal(err)
		}
		for _, subj := range req.MultiLast {
			named[subj[strings.LastIndexByte(subj, '.')+1:]] = true
		}
	}
	for _, id := range fresh {
		if !named[id] {
			t.Errorf("job %s was not in a batched read", id)
		}
	}
	for id := range final {
		if !named[id] {
			t.Errorf("final job %s was not in a batched read", id)
		}
	}
	if single > 0 {
		t.Errorf("%d single-key reads of records, want none", single)
	}
	for _, a := range h.up.Arrivals() {
		if final[a.ID] {
			t.Errorf("job %s, final before it was fetched, was delivered", a.ID)
		}
	}
}

// Reload changes a queue's rate at once and starts new queues; an invalid config is refused
// and changes nothing.
func TestReload(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "a"}, queue.Spec{Name: "b"})
	aIDs := workertest.Publish(t, h.qs, "a", 40, true)
	bIDs := workertest.Publish(t, h.qs, "b", 5, true)
	a := h.spec("a", 4) // 40 jobs would take 10s at this rate
	r := h.run(worker.Deps{}, a)
	h.up.WaitCount(t, 10*time.Second, "the first deliveries", func(n int) bool { return n >= 2 })

	bad := h.spec("", 1)
	if err := r.Reload([]worker.QueueConfig{a, bad}); err == nil {
		t.Fatal("Reload accepted a queue without a name")
	}
	if qs := r.Queues(); len(qs) != 1 || qs[0].Name != "a" || qs[0].Rate != a.Rate {
		t.Fatalf("after a refused reload the pool drains %+v, want a at its old rate", qs)
	}

	reloaded := time.Now()
	a.Rate = leaky.Every(200, time.Second)
	if err := r.Reload([]worker.QueueConfig{a, h.spec("b", 200)}); err != nil {
		t.Fatal(err)
	}
	total := len(aIDs) + len(bIDs)
	h.up.WaitCount(t, 10*time.Second, "every job of both queues", func(n int) bool { return n >= total })
	if took := time.Since(reloaded); took > 3*time.Second {
		t.Errorf("draining after the reload took %v; at the new rate it takes ~0.2s", took)
	}
	if d := h.up.Distinct(); d != total {
		t.Errorf("%d distinct jobs delivered, want %d", d, total)
	}
}

// FromConfig maps the file's queues: rate and burst to a leak rate, the upstream, the target,
// and max_pause_retries 0 to "none".
func TestFromConfig(t *testing.T) {
	cfg := mustConfig(t, `
upstream: http://127.0.0.1:9000
queues:
  - name: orders
    rate: 50/s
    burst: 5
    target: PUT http://127.0.0.1:9000/api/orders
    max_attempts: 3
    backoff: { initial: 2s, max: 1m }
    timeout: 4s
    concurrency: 7
    max_pause_retries: 0
  - name: plain
    rate: 10/m
`)
	qs := worker.FromConfig(cfg, nil) // no weights: no tenant ids to derive
	if len(qs) != 2 {
		t.Fatalf("%d queues, want 2", len(qs))
	}
	o := qs[0]
	if o.Name != "orders" || o.Rate != (leaky.Rate{Interval: 20 * time.Millisecond, Burst: 5}) ||
		o.Upstream != "http://127.0.0.1:9000" || o.Target == nil || o.Target.Method != "PUT" ||
		o.Target.URL != "http://127.0.0.1:9000/api/orders" || o.MaxAttempts != 3 ||
		o.Backoff.Initial != 2*time.Second || o.Backoff.Max != time.Minute || o.Timeout != 4*time.Second ||
		o.Concurrency != 7 || o.MaxPauseRetries != 0 || o.DefaultPause != config.DefaultPause {
		t.Errorf("orders = %+v", o)
	}
	p := qs[1]
	if p.Rate.Interval != 6*time.Second || p.Target != nil || p.MaxPauseRetries != 20 {
		t.Errorf("plain = %+v, want 6s interval, no target, the file's default 20 pause retries", p)
	}
}

// New refuses configs it cannot run.
func TestNewValidates(t *testing.T) {
	h := newHarness(t)
	for name, specs := range map[string][]worker.QueueConfig{
		"no rate":      {{Name: "q"}},
		"no name":      {{Rate: leaky.Every(1, time.Second)}},
		"relative URL": {{Name: "q", Rate: leaky.Every(1, time.Second), Upstream: "/x"}},
		"duplicate":    {h.spec("q", 1), h.spec("q", 2)},
		"tenant pause without fair": {func() worker.QueueConfig {
			s := h.spec("q", 1)
			s.PauseTenant = true
			return s
		}()},
		"negative max in flight": {func() worker.QueueConfig {
			s := h.spec("q", 1)
			s.MaxInFlight = -1
			return s
		}()},
	} {
		if _, err := worker.New(worker.Deps{Queues: h.qs, Schedule: h.sched}, specs); err == nil {
			t.Errorf("%s: New accepted %+v", name, specs)
		}
	}
	if _, err := worker.New(worker.Deps{}, nil); err == nil {
		t.Error("New accepted missing dependencies")
	}
}

// Run runs once.
func TestRunOnce(t *testing.T) {
	h := newHarness(t)
	p, err := worker.New(worker.Deps{Queues: h.qs, Schedule: h.sched}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Run(ctx); err != worker.ErrRunning {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
}

// TestWithdrawnJobNotDelivered: a job stored after its publisher stopped waiting (Job.AckBy),
// which the publisher then withdrew (status canceled), is not delivered; an equally late job
// that was not withdrawn is delivered once its publisher has had the time to withdraw it.
func TestWithdrawnJobNotDelivered(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	late := time.Now().Add(-200 * time.Millisecond)
	publish := func(body string) string {
		r, err := h.qs.Publish(h.ctx, &queue.Job{Queue: "q", Direct: true, Body: []byte(body), AckBy: late})
		if err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	withdrawn, kept := publish("withdrawn"), publish("kept")
	if err := h.qs.SetStatus(h.ctx, queue.Status{ID: withdrawn, Queue: "q", State: queue.StateCanceled}); err != nil {
		t.Fatal(err)
	}
	h.run(worker.Deps{}, h.spec("q", 100))
	if st := h.waitState(kept, queue.StateSucceeded, 10*time.Second); st.Attempts != 1 {
		t.Errorf("kept job: %+v", st)
	}
	testenv.WaitFor(t, 10*time.Second, "the withdrawn job to leave the queue", func() bool {
		in := h.info("q")
		return in.Depth == 0 && in.InFlight == 0
	})
	for _, a := range h.up.Arrivals() {
		if a.ID == withdrawn {
			t.Fatalf("the withdrawn job was delivered")
		}
	}
	if st := h.status(withdrawn); st.State != queue.StateCanceled {
		t.Errorf("withdrawn job's status %+v, want canceled", st)
	}
}

// countedTakes is a real schedule (leaky.Redis) that counts the calls that reserve slots.
type countedTakes struct {
	*leaky.Redis
	calls, slots atomic.Int64
}

func (c *countedTakes) Take(ctx context.Context, queue string, r leaky.Rate) (leaky.Slot, error) {
	c.calls.Add(1)
	c.slots.Add(1)
	return c.Redis.Take(ctx, queue, r)
}

func (c *countedTakes) TakeN(ctx context.Context, queue string, r leaky.Rate, n int) ([]leaky.Slot, error) {
	c.calls.Add(1)
	c.slots.Add(int64(n))
	return c.Redis.TakeN(ctx, queue, r, n)
}

// TestThrottledTakesShareCalls: a worker holding a backlog at a throttled rate of a thousand a
// second takes its slots several per call (turns, leaky.Coalesce), at the rate all the same.
func TestThrottledTakesShareCalls(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "q"})
	sched := &countedTakes{Redis: leaky.NewRedis(testenv.Redis(t).Client, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"})}
	spec := h.spec("q", 1000)
	spec.Concurrency = 64
	const n = 1000
	workertest.Publish(t, h.qs, "q", n, true)
	h.run(worker.Deps{Schedule: sched}, spec)
	h.up.WaitCount(t, 20*time.Second, "the backlog", func(k int) bool { return k >= n })
	calls, slots := sched.calls.Load(), sched.slots.Load()
	// From the 65th arrival on: the first ones open the connections and may each use up to
	// the 10ms a slot may be late, which over a one-second span is the whole 1%.
	rate := workertest.Rate(workertest.Times(h.up.Arrivals())[spec.Concurrency:])
	t.Logf("1000/s: %d jobs, %d slots in %d calls (%.2f per call), %.1f jobs/s", n, slots, calls, float64(slots)/float64(calls), rate)
	if calls*2 > slots { // one call per slot before turns: 1.0; measured since 4-6
		t.Errorf("%d calls for %d slots, want at least 2 slots per call", calls, slots)
	}
	if rate > 1000*1.01 {
		t.Errorf("delivered at %.1f/s, over the rate of 1000/s", rate)
	}
}

// TestPacedWritesGathered: the status writes of a queue paced at 250/s wait for the settle
// ticks (every 10 ms of the wall clock), so they land at the start of a tick; an unthrottled
// drain's go at once, spread over the tick. The drain runs after the paced queue has
// finished, so that a loaded machine delays the paced writes' wake-ups as little as it can.
func TestPacedWritesGathered(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "paced"}, queue.Spec{Name: "drain"})
	paced, drain := h.spec("paced", 250), h.spec("drain", 1000000)
	paced.Concurrency, drain.Concurrency = 64, 1 // the drain's writes one by one, over many ticks
	const n = 200
	ids := workertest.Publish(t, h.qs, "paced", n, true)
	h.run(worker.Deps{}, paced, drain)
	const tick, near = 10 * time.Millisecond, 5 * time.Millisecond
	shares := map[string]float64{}
	for _, c := range []struct {
		queue    string
		min, max float64 // bounds of the share of writes within near after a tick
	}{{"paced", 0.55, 1}, {"drain", 0, 0.65}} { // spread evenly: near/tick = 0.5 of them
		if c.queue == "drain" {
			ids = workertest.Publish(t, h.qs, "drain", n, true)
		}
		var at []time.Time
		testenv.WaitFor(t, 20*time.Second, c.queue+"'s records", func() bool {
			at = at[:0]
			for _, id := range ids {
				st, err := h.qs.Record(h.ctx, id)
				if err != nil || st.State != queue.StateSucceeded {
					return false
				}
				at = append(at, st.UpdatedAt)
			}
			return true
		})
		gathered := 0
		for _, u := range at {
			if time.Duration(u.UnixNano()%int64(tick)) < near {
				gathered++
			}
		}
		share := float64(gathered) / float64(len(at))
		t.Logf("%s: %.2f of %d status writes within %v after a %v tick", c.queue, share, len(at), near, tick)
		shares[c.queue] = share
		if share < c.min || share > c.max {
			t.Errorf("%s: %.2f of its status writes within %v after a tick, want %.2f..%.2f", c.queue, share, near, c.min, c.max)
		}
	}
	// On a quiet machine the paced writes land within near of a tick some 0.9 of the time; a
	// loaded one wakes the writers late and blurs both queues alike, so the gathering is
	// asserted against the ungathered drain measured in the same run.
	if shares["paced"] < shares["drain"]+0.1 {
		t.Errorf("paced writes %.2f within %v after a tick, the drain's %.2f: not gathered", shares["paced"], near, shares["drain"])
	}
}
