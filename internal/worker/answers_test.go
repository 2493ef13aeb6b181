package worker_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// Pool.Answers counts a queue's attempts by answer (429, 5xx, all) and by time in queue: a
// job answered 429, then 503, then 200 counts 3 attempts, one 429, one 5xx, and 3 times in
// queue, the later ones in buckets no earlier than the first (the pauses lie between).
func TestAnswersCountAttemptsByAnswerAndTimeInQueue(t *testing.T) {
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
	spec.DefaultPause = 300 * time.Millisecond
	r := h.run(worker.Deps{}, spec)
	h.waitState(ids[0], queue.StateSucceeded, 10*time.Second)

	a, ok := r.Answers()["q"]
	if !ok {
		t.Fatalf("Answers() = %v, want an entry for q", r.Answers())
	}
	if a.Delivered != 3 || a.R429 != 1 || a.R5xx != 1 {
		t.Errorf("delivered, 429, 5xx = %d, %d, %d; want 3, 1, 1", a.Delivered, a.R429, a.R5xx)
	}
	var n uint64
	first, last := -1, -1
	for i, c := range a.TimeInQueue {
		n += c
		if c > 0 && first < 0 {
			first = i
		}
		if c > 0 {
			last = i
		}
	}
	if n != 3 {
		t.Errorf("time-in-queue buckets %v hold %d attempts, want 3", a.TimeInQueue, n)
	}
	// Two pauses of ≥ 300 ms passed before the third attempt: it waited more than 500 ms.
	if last < 1 || worker.TimeInQueueBounds[last-1] < 500*time.Millisecond || first > last {
		t.Errorf("time-in-queue buckets %v: the last attempt should be past 500ms", a.TimeInQueue)
	}
}
