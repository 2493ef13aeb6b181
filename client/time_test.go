package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/retry"
)

// Submit sends the scheduling and priority options as the job API's headers.
func TestSubmitScheduleAndPriority(t *testing.T) {
	srv := newScripted(t, reply(202, `{"id":"j-1","queue":"q","state":"scheduled","eta":"2030-01-01T00:01:30Z"}`))
	c, _ := newClient(t, srv.Server)
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	if _, err := c.Submit(context.Background(), "q", nil, client.WithDelay(90*time.Second), client.WithPriority(client.PriorityHigh)); err != nil {
		t.Fatal(err)
	}
	job, err := c.Submit(context.Background(), "q", nil, client.WithNotBefore(at), client.WithPriority(client.PriorityLow))
	if err != nil || job.State != client.StateScheduled {
		t.Fatalf("job %+v, %v", job, err)
	}
	r := srv.requests()
	if h := r[0].Header; h.Get("Sluice-Delay") != "1m30s" || h.Get("Sluice-Priority") != "high" || h.Get("Sluice-Not-Before") != "" {
		t.Errorf("first submit's headers: %v", h)
	}
	if h := r[1].Header; h.Get("Sluice-Not-Before") != "2030-01-02T03:04:05Z" || h.Get("Sluice-Priority") != "low" || h.Get("Sluice-Delay") != "" {
		t.Errorf("second submit's headers: %v", h)
	}
}

// Wait keeps waiting through scheduled, without polling before the job's time, and reports a
// canceled job as such.
func TestWaitScheduled(t *testing.T) {
	nb := t0.Add(time.Hour).UTC().Format(time.RFC3339)
	srv := newScripted(t,
		reply(200, `{"id":"j-1","queue":"q","state":"scheduled","not_before":"`+nb+`"}`),
		reply(200, `{"id":"j-1","queue":"q","state":"queued"}`),
		reply(200, `{"id":"j-1","queue":"q","state":"succeeded","attempts":1}`),
	)
	c, clock := newClient(t, srv.Server, client.WithPollPolicy(retry.Policy{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: -1}))
	job, err := c.Wait(context.Background(), "j-1")
	if err != nil || job.State != client.StateSucceeded {
		t.Fatalf("job %+v, %v", job, err)
	}
	if got, want := clock.Waits(), []time.Duration{time.Hour, 100 * time.Millisecond}; !slices.Equal(got, want) {
		t.Errorf("waits %v, want %v: the first until the job's time", got, want)
	}

	srv = newScripted(t, reply(200, `{"id":"j-2","queue":"q","state":"scheduled"}`), reply(200, `{"id":"j-2","queue":"q","state":"canceled"}`))
	c, _ = newClient(t, srv.Server)
	job, err = c.Wait(context.Background(), "j-2")
	if !errors.Is(err, client.ErrJobCanceled) || job == nil || job.State != client.StateCanceled || !job.State.Final() {
		t.Fatalf("canceled job: %+v, %v", job, err)
	}
}
