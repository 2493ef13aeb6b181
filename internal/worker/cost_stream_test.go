package worker_test

import (
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

// TestUnitBudgetStreamed: deliveries whose answers stream (text/event-stream) are reconciled
// from their usage events, OpenAI-style (the include_usage chunk) and Anthropic-style
// (message_start's input tokens, message_delta's output tokens): 5 jobs of each charged 200
// whose streams report 50 are refunded 150 each, and 50 each counted delivered.
func TestUnitBudgetStreamed(t *testing.T) {
	h := newHarness(t, queue.Spec{Name: "openai"}, queue.Spec{Name: "anthropic"})
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	h.up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		var b strings.Builder
		if strings.HasSuffix(a.URI, "/anthropic") {
			b.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":20,\"output_tokens\":1}}}\n\n")
			for range 3 {
				b.WriteString("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"hi\"}}\n\n")
			}
			b.WriteString("event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":30}}\n\n")
			b.WriteString("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		} else {
			for range 3 {
				b.WriteString("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
			}
			fmt.Fprintf(&b, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":30,\"total_tokens\":50}}\n\ndata: [DONE]\n\n")
		}
		return workertest.Reply{Header: sse, Body: []byte(b.String())}
	})
	units := func(s worker.QueueConfig, from string) worker.QueueConfig {
		s.Units = leaky.Units{N: 1000, Per: time.Second}
		s.CostCapacity = 1000
		c, err := config.ParseCost(from, true)
		if err != nil {
			t.Fatal(err)
		}
		s.CostFromResponse = c
		return s
	}
	publishCost(t, h.qs, "openai", 5, 200)
	publishCost(t, h.qs, "anthropic", 5, 200)
	r := h.run(worker.Deps{},
		units(h.spec("openai", 100), "json:/usage/total_tokens"),
		units(h.spec("anthropic", 100), "json:/usage/input_tokens + json:/usage/output_tokens"))
	for _, q := range []string{"openai", "anthropic"} {
		testenv.WaitFor(t, 10*time.Second, q+": the units delivered counted", func() bool {
			return metric(t, r.reg, "sluice_units_delivered_total", "queue", q) == 250
		})
		if got := metric(t, r.reg, "sluice_units_reconciled_total", "queue", q, "direction", "refund"); got != 750 {
			t.Errorf("%s: units refunded = %v, want 750 (5 × 150)", q, got)
		}
		if got := metric(t, r.reg, "sluice_cost_unreconciled_total", "queue", q); got != 0 {
			t.Errorf("%s: %v streamed answers unreconciled, want 0", q, got)
		}
	}
}
