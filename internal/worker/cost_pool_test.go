package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// publishCost publishes n direct jobs of cost each to queue name.
func publishCost(t *testing.T, qs *queue.Queues, name string, n int, cost int64) {
	t.Helper()
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := qs.Publish(ctx, &queue.Job{Queue: name, Direct: true, Cost: cost, Body: []byte("x")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestUnitBudget: a queue with a unit budget (1000 units/s) spaces its jobs by their units,
// and refunds of true costs read from the answer bring the jobs waiting forward: 6 jobs
// charged 200 units (200ms each) that cost 50 get slots at least 50ms apart, and a job that
// takes its units after the previous job's refund gets them as soon as the refund allows, not
// 200ms on. A job costing more than the budget can deliver at once is charged the capacity
// and delivered; an answer without its true cost leaves the estimate standing and is counted.
func TestUnitBudget(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "tokens"}, queue.Spec{Name: "big"})
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		if strings.HasSuffix(a.URI, "/tokens") {
			return workertest.Reply{Body: []byte(`{"usage":{"total":50}}`)}
		}
		return workertest.Reply{Body: []byte(`{}`)}
	})
	units := func(s worker.QueueConfig) worker.QueueConfig {
		s.Units = leaky.Units{N: 1000, Per: time.Second}
		s.CostCapacity = 1000
		s.CostFromResponse = config.Cost{Kind: config.CostJSON, Name: "/usage/total"}
		return s
	}
	publishCost(t, h.qs, "tokens", 6, 200)
	publishCost(t, h.qs, "big", 1, 5000)
	sl := newMemorySlotLog()
	r := h.run(worker.Deps{Schedule: sl}, units(h.spec("tokens", 100)), units(h.spec("big", 100)))
	h.up.WaitCount(t, 10*time.Second, "7 deliveries", func(n int) bool { return n >= 7 })
	testenv.WaitFor(t, 5*time.Second, "the units delivered counted", func() bool {
		return metric(t, r.reg, "sluice_units_delivered_total", "queue", "big") == 1000 &&
			metric(t, r.reg, "sluice_units_delivered_total", "queue", "tokens") == 300
	})
	// The spacing is read from the slots the schedule gave, not from the arrivals: a delivery
	// leaves within the rate's tolerance (5ms at 100/s) of its slot or gives the slot up
	// (leaky's guarantee), and then takes however long the loaded machine makes its trip to
	// the upstream, which bounds nothing (32ms between two arrivals 50ms apart was seen). A
	// given-up slot keeps its charge of 200 units (a reservation is not given back), so the
	// span of the 6 deliveries bounds nothing either: under load 4 slots in a row were given
	// up, and the 6 took 1.05s.
	slots := sl.of("tokens")
	sooner := 0 // slots that came sooner than the estimate alone would have put them
	for i := 1; i < len(slots); i++ {
		prev, s := slots[i-1], slots[i]
		// A charge never moves on less than the true cost, 50ms; Slot.At is the take's
		// instant plus a wait in whole µs counted from it truncated to the µs: 1µs early at
		// most.
		gap := s.at.Sub(prev.at)
		if gap < 50*time.Millisecond-time.Microsecond {
			t.Errorf("slot %d came %v after the previous one, under its 50 units (50ms)", i, gap)
		}
		if gap < 200*time.Millisecond {
			sooner++
		}
		// A take after the previous slot's job was refunded gets its units as soon as the
		// refund allows: at the take, or 50ms after the previous slot.
		refunded := !prev.reconciled.IsZero() && prev.reconciled.Before(s.before)
		if due := prev.at.Add(50 * time.Millisecond); refunded && s.at.After(laterOf(s.after, due).Add(time.Microsecond)) {
			t.Errorf("slot %d, taken after a refund, came %v after the previous one; want by the later of its take (%v) and 50ms",
				i, gap, s.after.Sub(prev.at))
		}
	}
	if sooner == 0 {
		t.Errorf("no slot of %d came sooner than 200ms after the previous one: the refunds brought none forward", len(slots))
	}
	if given := metric(t, r.reg, "sluice_worker_slots_given_up_total", "queue", "tokens"); len(slots) != 6+int(given) {
		t.Errorf("%d slots charged, %v given up; want 6 delivered", len(slots), given)
	}
	if got := metric(t, r.reg, "sluice_units_delivered_total", "queue", "tokens"); got != 300 {
		t.Errorf("units delivered of tokens = %v, want 300 (6 × 50)", got)
	}
	if got := metric(t, r.reg, "sluice_units_reconciled_total", "queue", "tokens", "direction", "refund"); got != 900 {
		t.Errorf("units refunded = %v, want 900 (6 × 150)", got)
	}
	if got := metric(t, r.reg, "sluice_cost_unreconciled_total", "queue", "big"); got != 1 {
		t.Errorf("unreconciled answers of big = %v, want 1", got)
	}
}

// laterOf returns the later of a and b.
func laterOf(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestUnitRateLearned: an adaptive queue with a unit budget of 1000 units/s, whose upstream
// says it takes 12 000 tokens a minute (200/s), spaces its 100-unit jobs 500ms apart once the
// first answer is in; the same queue not adaptive keeps its own budget (100ms apart).
//
// A gap between two arrivals is measured at the upstream: one the machine held late makes the
// gap after it short. An attempt whose gaps outside their bounds the process's stalls
// (testenv.Lag) explain is made again, up to 3 times.
func TestUnitRateLearned(t *testing.T) {
	for attempt := 1; ; attempt++ {
		var short string
		t.Run(fmt.Sprintf("attempt%d", attempt), func(t *testing.T) { short = unitRateLearned(t) })
		if t.Failed() || short == "" {
			return
		}
		t.Logf("attempt %d: %s", attempt, short)
		if attempt == 3 {
			t.Fatalf("in 3 attempts the machine stalled the deliveries' spacing")
		}
	}
}

// unitRateLearned is one attempt of TestUnitRateLearned; it returns the gaps out of bounds that
// the process's stalls explain, or "".
func unitRateLearned(t *testing.T) string {
	lag := testenv.NewLag(t)
	h := newHarness(t, queue.Spec{Name: "learned"}, queue.Spec{Name: "fixed"})
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		return workertest.Reply{Header: http.Header{"X-Ratelimit-Limit-Tokens": {"12000"}}}
	})
	units := func(s worker.QueueConfig, adaptive bool) worker.QueueConfig {
		s.Units = leaky.Units{N: 1000, Per: time.Second}
		s.CostCapacity = 1000
		s.Adaptive, s.MinRate = adaptive, 1
		return s
	}
	publishCost(t, h.qs, "learned", 5, 100)
	publishCost(t, h.qs, "fixed", 5, 100)
	h.run(worker.Deps{}, units(h.spec("learned", 100), true), units(h.spec("fixed", 100), false))
	h.up.WaitCount(t, 15*time.Second, "10 deliveries", func(n int) bool { return n >= 10 })
	at := map[string][]time.Time{}
	for _, a := range h.up.Arrivals() {
		q := a.URI[strings.LastIndexByte(a.URI, '/')+1:]
		at[q] = append(at[q], a.At)
	}
	var short []string
	// gapIn checks the gap before arrival i of q against [lo, hi]; one outside that the
	// process's stalls around it explain (the earlier arrival held late, or the later one) is
	// returned, any other fails.
	gapIn := func(q string, i int, lo, hi time.Duration, want string) {
		prev, cur := at[q][i-1], at[q][i]
		gap := cur.Sub(prev)
		off := max(lo-gap, gap-hi)
		if off <= 0 {
			return
		}
		msg := fmt.Sprintf("%s: job %d came %v after the previous one, want %s", q, i, gap, want)
		if lost, _ := lag.Lost(prev.Add(-lo), cur); lost < off {
			t.Errorf("%s; the process stalled %v around them", msg, lost)
		} else {
			short = append(short, fmt.Sprintf("%s; the process stalled %v around them", msg, lost))
		}
	}
	for i := 1; i < 5; i++ {
		gapIn("fixed", i, 90*time.Millisecond, 400*time.Millisecond, "its own budget's 100ms") // 10ms for a slot taken late
	}
	// The second job may have taken its units before the first answer taught the rate.
	for i := 3; i < 5; i++ {
		gapIn("learned", i, 480*time.Millisecond, time.Hour, "the upstream's 200 tokens/s (500ms)")
	}
	return strings.Join(short, "; ")
}
