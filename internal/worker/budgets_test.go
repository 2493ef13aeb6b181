package worker_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/leaky"
	"github.com/sluice-rl/sluice/queue"
)

// TestQueueBudgets: a queue with an input budget (1000 units/s) and an output budget (500
// units/s), each reconciled from the answer's usage with its own pointer, on a Redis schedule.
// Each job is charged 120 input and 100 output units at acceptance (Job.Costs); the upstream
// reports 100 input units and 50 to 100 output units. Output binds (about 75 a job): the
// true units the upstream receives in any second stay within each budget's rate plus one
// job's charge, and at least 85% of the output budget is used over the run.
func TestQueueBudgets(t *testing.T) {
	const (
		jobs       = 30
		inRate     = 1000
		outRate    = 500
		inCharge   = 120
		outCharge  = 100
		inTrue     = 100
		outTrueMin = 50
	)
	// The k-th job to arrive uses 50 to 100 output units, as outTrue says; reported by job id.
	outTrue := func(k int) int64 { return outTrueMin + int64(k*17%51) }
	var (
		mu   sync.Mutex
		outs = map[string]int64{}
	)
	h := newHarness(t, queue.Spec{Name: "llm"})
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		mu.Lock()
		out, ok := outs[a.ID]
		if !ok {
			out = outTrue(len(outs))
			outs[a.ID] = out
		}
		mu.Unlock()
		return workertest.Reply{Body: fmt.Appendf(nil, `{"usage":{"prompt_tokens":%d,"completion_tokens":%d}}`, inTrue, out)}
	})
	for range jobs {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := h.qs.Publish(ctx, &queue.Job{Queue: "llm", Direct: true, Costs: []int64{inCharge, outCharge}, Body: []byte("x")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	spec := h.spec("llm", 1000)
	spec.Budgets = []worker.Budget{
		{Name: "input", Units: leaky.Units{N: inRate, Per: time.Second}, Capacity: inRate,
			CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/usage/prompt_tokens"}},
		{Name: "output", Units: leaky.Units{N: outRate, Per: time.Second}, Capacity: outRate,
			CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/usage/completion_tokens"}},
	}
	sched := leaky.NewRedis(testenv.Redis(t).Client, leaky.RedisConfig{Prefix: testenv.Name(t) + ":"})
	r := h.run(worker.Deps{Schedule: sched}, spec)
	h.up.WaitCount(t, 15*time.Second, "every job delivered", func(n int) bool { return n >= jobs })

	arr := h.up.Arrivals()
	if len(arr) != jobs {
		t.Fatalf("%d arrivals of %d jobs: a job was delivered twice", len(arr), jobs)
	}
	mu.Lock()
	defer mu.Unlock()
	type delivery struct {
		at      time.Time
		in, out int64
	}
	ds := make([]delivery, len(arr))
	var outSum int64
	for i, a := range arr {
		ds[i] = delivery{a.At, inTrue, outs[a.ID]}
		outSum += ds[i].out
	}
	// Any window of one second, from each arrival: within rate × 1s + one job's charge (the
	// slot that opens the window may carry a whole charge), + 5% for a slot taken late.
	var maxIn, maxOut int64
	for i := range ds {
		var in, out int64
		for j := i; j < len(ds) && ds[j].at.Sub(ds[i].at) < time.Second; j++ {
			in, out = in+ds[j].in, out+ds[j].out
		}
		maxIn, maxOut = max(maxIn, in), max(maxOut, out)
		if lim := int64(inRate*1.05) + inCharge; in > lim {
			t.Errorf("input: %d units in the second from arrival %d, over %d", in, i, lim)
		}
		if lim := int64(outRate*1.05) + outCharge; out > lim {
			t.Errorf("output: %d units in the second from arrival %d, over %d", out, i, lim)
		}
	}
	// The units of every job from the second to the last but one were spaced before the last
	// went: used / (rate × span). (The first delivery opens the upstream's connection, and
	// arrives later after its slot than the others.)
	span := ds[len(ds)-1].at.Sub(ds[1].at)
	used := float64(outSum-ds[0].out-ds[len(ds)-1].out) / (outRate * span.Seconds())
	inUsed := float64(inTrue*(len(ds)-2)) / (inRate * span.Seconds())
	t.Logf("%d jobs, the second to the last in %v: output budget used %.1f%%, input %.1f%%; the most in one second: output %d (rate %d), input %d (rate %d)",
		len(ds), span.Round(time.Millisecond), 100*used, 100*inUsed, maxOut, outRate, maxIn, inRate)
	if used < 0.85 || used > 1.05 {
		t.Errorf("output budget used %.1f%%, want 85%% to 105%% (the binding budget, reconciled)", 100*used)
	}
	testenv.WaitFor(t, 5*time.Second, "the units delivered counted", func() bool {
		return metric(t, r.reg, "sluice_units_delivered_total", "queue", "llm/output") == float64(outSum) &&
			metric(t, r.reg, "sluice_units_delivered_total", "queue", "llm/input") == float64(inTrue*len(ds))
	})
	if got, want := metric(t, r.reg, "sluice_units_reconciled_total", "queue", "llm/input", "direction", "refund"), float64((inCharge-inTrue)*len(ds)); got != want {
		t.Errorf("input units refunded = %v, want %v", got, want)
	}
	for _, a := range arr {
		if !strings.HasSuffix(a.URI, "/llm") {
			t.Errorf("arrival at %s", a.URI)
		}
	}
}

// FromConfig maps a queue's budgets, each with its units, capacity and pointer; the worker
// refuses budgets beside a unit budget of the queue's own.
func TestBudgetsFromConfig(t *testing.T) {
	cfg := mustConfig(t, `upstream: http://127.0.0.1:9000
queues:
  - name: llm
    rate: 10/s
    budgets:
      - {name: input, cost_rate: 400000/m, cost: 'json:/n', cost_from_response: json:/usage/prompt_tokens}
      - {name: output, cost_rate: 80000/m, cost_burst: 90000}
`)
	qcs := worker.FromConfig(cfg, func(k []byte) string { return string(k) })
	bs := qcs[0].Budgets
	if len(bs) != 2 || !qcs[0].Units.IsZero() {
		t.Fatalf("budgets %+v, units %v", bs, qcs[0].Units)
	}
	if bs[0].Name != "input" || bs[0].Units != (leaky.Units{N: 400000, Per: time.Minute}) || bs[0].Capacity != 400000 || !bs[0].CostFromResponse.IsSet() {
		t.Errorf("input %+v", bs[0])
	}
	if bs[1].Name != "output" || bs[1].Units != (leaky.Units{N: 80000, Per: time.Minute, Burst: 90000}) || bs[1].Capacity != 90000 || bs[1].CostFromResponse.IsSet() {
		t.Errorf("output %+v", bs[1])
	}
	h := newHarness(t, queue.Spec{Name: "llm"})
	bad := h.spec("llm", 10)
	bad.Budgets, bad.Units = bs, leaky.Units{N: 1, Per: time.Second}
	if _, err := worker.New(worker.Deps{Queues: h.qs, Schedule: h.sched}, []worker.QueueConfig{bad}); err == nil ||
		!strings.Contains(err.Error(), "a queue with budgets has no unit budget of its own") {
		t.Errorf("New with budgets and units: %v", err)
	}
	// A schedule that keeps no budgets would let the jobs go without them: refused.
	good := h.spec("llm", 10)
	good.Budgets = bs
	type plain struct{ leaky.Schedule }
	if _, err := worker.New(worker.Deps{Queues: h.qs, Schedule: plain{h.sched}}, []worker.QueueConfig{good}); err == nil ||
		!strings.Contains(err.Error(), "its budgets need a schedule that keeps them") {
		t.Errorf("New with budgets on a schedule without them: %v", err)
	}
}

// TestQueueBudgetsStreamed: an Anthropic-style streamed answer reconciles each budget from its
// own usage events: message_start's input tokens the input budget, message_delta's output
// tokens the output budget.
func TestQueueBudgetsStreamed(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "llm"})
	h.up.Respond(func(workertest.Arrival, int) workertest.Reply {
		body := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n" +
			"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n" +
			"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
		return workertest.Reply{Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: []byte(body)}
	})
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := h.qs.Publish(ctx, &queue.Job{Queue: "llm", Direct: true, Costs: []int64{100, 100}, Body: []byte("x")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	spec := h.spec("llm", 100)
	spec.Budgets = []worker.Budget{
		{Name: "input", Units: leaky.Units{N: 1000, Per: time.Second}, Capacity: 1000,
			CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/usage/input_tokens"}},
		{Name: "output", Units: leaky.Units{N: 1000, Per: time.Second}, Capacity: 1000,
			CostFromResponse: config.Cost{Kind: config.CostJSON, Name: "/usage/output_tokens"}},
	}
	r := h.run(worker.Deps{}, spec)
	testenv.WaitFor(t, 10*time.Second, "the units delivered counted", func() bool {
		return metric(t, r.reg, "sluice_units_delivered_total", "queue", "llm/input") == 60 &&
			metric(t, r.reg, "sluice_units_delivered_total", "queue", "llm/output") == 90
	})
	for b, want := range map[string]float64{"input": 240, "output": 210} {
		if got := metric(t, r.reg, "sluice_units_reconciled_total", "queue", "llm/"+b, "direction", "refund"); got != want {
			t.Errorf("%s: units refunded = %v, want %v", b, got, want)
		}
	}
}
