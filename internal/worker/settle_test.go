package worker

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
	"github.com/sluice-rl/sluice/retry"
)

// Each row is one rule of the package doc's "Counting attempts", on the record a redelivery
// reads.
func TestRecallState(t *testing.T) {
	const maxAttempts = 5
	unreadable := errors.New("nats: timeout")
	tests := []struct {
		name      string
		delivered uint64
		st        queue.Status
		err       error
		unread    bool // a first delivery outside a suspicion window: its record is not read
		want      jobState
		end       passEnd
		stop      bool
	}{
		{name: "a first delivery spends from zero and reads nothing", delivered: 1, unread: true,
			want: jobState{delivered: 1}},
		{name: "a first delivery after a reconnect whose record succeeded: NATS lost its count; acked", delivered: 1,
			st:   queue.Status{State: queue.StateSucceeded, Attempts: 1, Delivered: 1},
			want: jobState{delivered: 1}, end: endFinal, stop: true},
		{name: "a first delivery after a reconnect with a running record goes on from its attempts", delivered: 1,
			st:   queue.Status{State: queue.StateRunning, Attempts: 1, Delivered: 1},
			want: jobState{delivered: 1, attempts: 1, prev: queue.Status{State: queue.StateRunning, Attempts: 1, Delivered: 1}}},
		{name: "a first delivery whose record failed is a replayed dead letter: delivered afresh", delivered: 1,
			st:   queue.Status{State: queue.StateFailed, Attempts: 3, Delivered: 3, DeadLetter: true},
			want: jobState{delivered: 1}},
		{name: "a first delivery after a reconnect with no record spends from zero", delivered: 1,
			err: queue.ErrNotFound, want: jobState{delivered: 1}},
		{name: "a redelivery whose record succeeded is acked, not delivered", delivered: 2,
			st:   queue.Status{State: queue.StateSucceeded, Attempts: 1, Delivered: 1},
			want: jobState{delivered: 2}, end: endFinal, stop: true},
		{name: "a redelivery whose record failed is acked, not delivered", delivered: 3,
			st:   queue.Status{State: queue.StateFailed, Attempts: 2, Delivered: 2},
			want: jobState{delivered: 3}, end: endFinal, stop: true},
		{name: "a redelivery of a canceled job is acked, not delivered", delivered: 2,
			st: queue.Status{State: queue.StateCanceled}, want: jobState{delivered: 2}, end: endFinal, stop: true},
		{name: "attempts come from the record written by the previous delivery", delivered: 4,
			st:   queue.Status{State: queue.StateRetrying, Attempts: 2, Delivered: 3},
			want: jobState{delivered: 4, attempts: 2, prev: queue.Status{State: queue.StateRetrying, Attempts: 2, Delivered: 3}}},
		{name: "deliveries after the last record left none and count as spent", delivered: 4,
			st:   queue.Status{State: queue.StateRetrying, Attempts: 1, Delivered: 1},
			want: jobState{delivered: 4, attempts: 3, prev: queue.Status{State: queue.StateRetrying, Attempts: 1, Delivered: 1}}},
		{name: "a running record counts its attempt: the upstream may have seen it", delivered: 3,
			st:   queue.Status{State: queue.StateRunning, Attempts: 2, Delivered: 2},
			want: jobState{delivered: 3, attempts: 2, prev: queue.Status{State: queue.StateRunning, Attempts: 2, Delivered: 2}}},
		{name: "a hand-back recorded its delivery, so it is no attempt", delivered: 2,
			st:   queue.Status{State: queue.StateQueued, Attempts: 0, Delivered: 1},
			want: jobState{delivered: 2, prev: queue.Status{State: queue.StateQueued, Delivered: 1}}},
		{name: "no record at all: every earlier delivery counts as spent", delivered: 3,
			err: queue.ErrNotFound, want: jobState{delivered: 3, attempts: 2}},
		{name: "an unreadable record sends nothing: the attempts are unknown", delivered: 4, err: unreadable,
			want: jobState{delivered: 4}, end: endUnread, stop: true},
		{name: "holds are read from the record", delivered: 4,
			st:   queue.Status{State: queue.StateRetrying, Attempts: 1, Held: 2, Delivered: 3},
			want: jobState{delivered: 4, attempts: 1, held: 2, prev: queue.Status{State: queue.StateRetrying, Attempts: 1, Held: 2, Delivered: 3}}},
		{name: "a job whose attempts are spent is dead-lettered without a delivery", delivered: 6,
			st:   queue.Status{State: queue.StateRunning, Attempts: 5, Delivered: 5},
			want: jobState{delivered: 6, attempts: 5, prev: queue.Status{State: queue.StateRunning, Attempts: 5, Delivered: 5}},
			end:  endExhausted, stop: true},
		{name: "deliveries that left no record can spend the last attempt", delivered: 7,
			st:   queue.Status{State: queue.StateRetrying, Attempts: 2, Delivered: 3},
			want: jobState{delivered: 7, attempts: 5, prev: queue.Status{State: queue.StateRetrying, Attempts: 2, Delivered: 3}},
			end:  endExhausted, stop: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, end, stop := recallState(tt.delivered, tt.st, tt.err, !tt.unread, maxAttempts)
			if !reflect.DeepEqual(got, tt.want) || end != tt.end || stop != tt.stop {
				t.Errorf("recallState = %+v, %v, %v; want %+v, %v, %v", got, end, stop, tt.want, tt.end, tt.stop)
			}
		})
	}
}

// Each row is one rule of what becomes of a job after a pass: the package doc's "One job" and
// "Counting attempts".
func TestSettle(t *testing.T) {
	cfg := &QueueConfig{MaxAttempts: 3, MaxPauseRetries: 2, DefaultPause: 7 * time.Second,
		Backoff: retry.Policy{Initial: time.Second, Max: time.Minute, Jitter: -1}}
	noPauseRetries := *cfg
	noPauseRetries.MaxPauseRetries = 0
	byTenant := *cfg
	byTenant.Fair, byTenant.PauseTenant = true, true
	first := jobState{delivered: 1}
	second := jobState{delivered: 2, attempts: 1,
		prev: queue.Status{State: queue.StateRetrying, Attempts: 1, LastError: "upstream answered 500 Internal Server Error",
			Response: &queue.Response{Status: 500}, Delivered: 1}}
	resp := func(code int) *queue.Response { return &queue.Response{Status: code} }
	delivered := func(c retry.Class, status int, lastErr string) outcome {
		return outcome{end: endDelivered, class: c, status: status, lastErr: lastErr}
	}
	withWait := func(o outcome, d time.Duration) outcome { o.wait, o.hasWait = d, true; return o }
	const e500, e429 = "upstream answered 500 Internal Server Error", "upstream answered 429 Too Many Requests"

	tests := []struct {
		name string
		s    jobState
		cfg  *QueueConfig
		o    outcome
		want plan
	}{
		{name: "an unread record: back after a second, nothing recorded", s: second, o: outcome{end: endUnread},
			want: plan{how: nak, delay: unreadDelay}},
		{name: "2xx: succeeded with this attempt, then ack", s: first, o: delivered(retry.Success, 200, ""),
			want: plan{how: ack, record: &record{state: queue.StateSucceeded, attempts: 1, response: resp(200)}}},
		{name: "5xx: retrying after the attempt's backoff, the attempt spent", s: first,
			o:    delivered(retry.Retry, 500, e500),
			want: plan{how: nak, delay: time.Second, record: &record{state: queue.StateRetrying, attempts: 1, lastErr: e500, response: resp(500), next: time.Second, hasNext: true}}},
		{name: "5xx: the second attempt backs off twice as long", s: second,
			o:    delivered(retry.Retry, 500, e500),
			want: plan{how: nak, delay: 2 * time.Second, record: &record{state: queue.StateRetrying, attempts: 2, lastErr: e500, response: resp(500), next: 2 * time.Second, hasNext: true}}},
		{name: "5xx: a Retry-After longer than the backoff wins", s: first,
			o:    withWait(delivered(retry.Retry, 503, e500), 10*time.Second),
			want: plan{how: nak, delay: 10 * time.Second, record: &record{state: queue.StateRetrying, attempts: 1, lastErr: e500, response: resp(503), next: 10 * time.Second, hasNext: true}}},
		{name: "a timeout or connection error is retried, with no response", s: first,
			o:    delivered(retry.Retry, 0, "upstream timed out after 1s"),
			want: plan{how: nak, delay: time.Second, record: &record{state: queue.StateRetrying, attempts: 1, lastErr: "upstream timed out after 1s", next: time.Second, hasNext: true}}},
		{name: "the last attempt failing dead-letters the job", s: jobState{delivered: 3, attempts: 2},
			o:    delivered(retry.Retry, 500, e500),
			want: plan{how: deadLetter, reason: reasonMaxAttempts, deadErr: e500, deadStatus: 500, deadAttempts: 3}},
		{name: "a permanent answer dead-letters at once", s: first,
			o:    delivered(retry.Permanent, 404, "upstream answered 404 Not Found"),
			want: plan{how: deadLetter, reason: reasonPermanent, deadErr: "upstream answered 404 Not Found", deadStatus: 404, deadAttempts: 1}},
		{name: "429 with Retry-After: the queue pauses for it and the attempt is not spent", s: second,
			o:    withWait(delivered(retry.Pause, 429, e429), 20*time.Second),
			want: plan{pause: 20 * time.Second, how: nak, delay: 20 * time.Second, record: &record{state: queue.StateRetrying, attempts: 1, lastErr: e429, response: resp(429), next: 20 * time.Second, hasNext: true}}},
		{name: "429 without a wait pauses for the default pause", s: first,
			o:    delivered(retry.Pause, 429, e429),
			want: plan{pause: 7 * time.Second, how: nak, delay: 7 * time.Second, record: &record{state: queue.StateRetrying, attempts: 0, lastErr: e429, response: resp(429), next: 7 * time.Second, hasNext: true}}},
		{name: "the last allowed pause retry is still retried", s: jobState{delivered: 3, attempts: 1},
			o:    delivered(retry.Pause, 429, e429),
			want: plan{pause: 7 * time.Second, how: nak, delay: 7 * time.Second, record: &record{state: queue.StateRetrying, attempts: 1, lastErr: e429, response: resp(429), next: 7 * time.Second, hasNext: true}}},
		{name: "beyond max_pause_retries: paused, the attempt put back, then dead-lettered", s: jobState{delivered: 4, attempts: 1},
			o: delivered(retry.Pause, 429, e429),
			want: plan{pause: 7 * time.Second, how: deadLetter,
				record: &record{state: queue.StateRetrying, attempts: 1, lastErr: e429, response: resp(429)},
				reason: reasonMaxPauseRetries, deadErr: e429 + "; gave up after 2 pause retries", deadStatus: 429, deadAttempts: 1}},
		{name: "crash redeliveries and hand-backs count against max_pause_retries too", s: jobState{delivered: 5, attempts: 2},
			o: delivered(retry.Pause, 503, "upstream answered 503 Service Unavailable"),
			want: plan{pause: 7 * time.Second, how: deadLetter,
				record: &record{state: queue.StateRetrying, attempts: 2, lastErr: "upstream answered 503 Service Unavailable", response: resp(503)},
				reason: reasonMaxPauseRetries, deadErr: "upstream answered 503 Service Unavailable; gave up after 2 pause retries", deadStatus: 503, deadAttempts: 2}},
		{name: "max_pause_retries 0: the first 429 dead-letters", s: first, cfg: &noPauseRetries,
			o: delivered(retry.Pause, 429, e429),
			want: plan{pause: 7 * time.Second, how: deadLetter,
				record: &record{state: queue.StateRetrying, attempts: 0, lastErr: e429, response: resp(429)},
				reason: reasonMaxPauseRetries, deadErr: e429 + "; gave up after 0 pause retries", deadStatus: 429, deadAttempts: 0}},
		{name: "pause_scope tenant: a 429 pauses the job's tenant, not the queue", s: jobState{delivered: 1, tenant: "t1"}, cfg: &byTenant,
			o:    withWait(delivered(retry.Pause, 429, e429), 5*time.Second),
			want: plan{pause: 5 * time.Second, pauseTenant: "t1", how: nak, delay: 5 * time.Second, record: &record{state: queue.StateRetrying, attempts: 0, lastErr: e429, response: resp(429), next: 5 * time.Second, hasNext: true}}},
		{name: "held while its tenant is paused: back after the pause and a jitter, nothing spent, the hold counted", s: second, cfg: &byTenant,
			o:    outcome{end: endHold, wait: 3 * time.Second},
			want: plan{how: nak, delay: 3*time.Second + heldSpread/2, record: &record{state: queue.StateRetrying, attempts: 1, held: 1, lastErr: e500, response: resp(500), next: 3*time.Second + heldSpread/2, hasNext: true}}},
		{name: "holds do not count against max_pause_retries", s: jobState{delivered: 5, attempts: 1, held: 2, tenant: "t1"}, cfg: &byTenant,
			o:    delivered(retry.Pause, 429, e429),
			want: plan{pause: 7 * time.Second, pauseTenant: "t1", how: nak, delay: 7 * time.Second, record: &record{state: queue.StateRetrying, attempts: 1, held: 2, lastErr: e429, response: resp(429), next: 7 * time.Second, hasNext: true}}},
		{name: "a redelivery already final is acked as final, unconfirmed", s: jobState{delivered: 2},
			o: outcome{end: endFinal}, want: plan{how: ack, final: true, skipped: true}},
		{name: "a job canceled by an operator is acked, not delivered", s: first,
			o: outcome{end: endCanceled}, want: plan{how: ack, final: true, skipped: true}},
		{name: "a job withdrawn by its publisher is acked, not delivered", s: first,
			o: outcome{end: endWithdrawn}, want: plan{how: ack, final: true, skipped: true}},
		{name: "spent attempts found on redelivery: dead-lettered with the recorded error", s: jobState{delivered: 4, attempts: 3,
			prev: queue.Status{State: queue.StateRunning, Attempts: 3, LastError: e500, Response: resp(500)}},
			o:    outcome{end: endExhausted},
			want: plan{how: deadLetter, reason: reasonMaxAttempts, deadErr: e500, deadStatus: 500, deadAttempts: 3}},
		{name: "not sent on a first delivery: handed back, recorded queued, no attempt", s: first,
			o:    outcome{end: endNotSent},
			want: plan{how: handBack, record: &record{state: queue.StateQueued, attempts: 0}}},
		{name: "not sent on a redelivery: handed back with its record as it was", s: second,
			o:    outcome{end: endNotSent},
			want: plan{how: handBack, record: &record{state: queue.StateRetrying, attempts: 1, lastErr: e500, response: resp(500)}}},
		{name: "cut short by shutdown: handed back, the attempt spent", s: second,
			o:    outcome{end: endInterrupted},
			want: plan{how: handBack, record: &record{state: queue.StateRetrying, attempts: 2, lastErr: "delivery interrupted by worker shutdown"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := cfg
			if tt.cfg != nil {
				c = tt.cfg
			}
			got := settle(tt.s, tt.o, c, 0.5)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("settle =\n  %s\nwant\n  %s", show(got), show(tt.want))
			}
		})
	}
}

func show(p plan) string {
	s := ""
	if p.record != nil {
		s = "record " + reflectString(*p.record) + "; "
	}
	p.record = nil
	return s + reflectString(p)
}

func reflectString(v any) string { return fmt.Sprintf("%+v", v) }
