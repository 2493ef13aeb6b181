package config

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestWarnUntenantedKeyedQueue checks the warning for a queue fed by a rule keyed by API key
// and without a tenant, and that a tenant, or a rule keyed by IP only, silences it.
func TestWarnUntenantedKeyedQueue(t *testing.T) {
	const rules = `
rules:
  - {name: orders-per-key, key: [header:X-API-Key], algorithm: gcra, limit: 1, period: 1s, on_limit: enqueue, queue: orders}
  - {name: all-reports, key: [ip], action: enqueue, queue: reports}
`
	c := mustParse(t, "upstream: http://u\nqueues:\n  - {name: orders, rate: 1/s}\n  - {name: reports, rate: 1/s}\n"+rules)
	w := c.Warnings()
	if len(w) != 1 || !strings.Contains(w[0], `queues[0] "orders"`) || !strings.Contains(w[0], "set tenant: [header:X-Api-Key]") {
		t.Fatalf("warnings %q, want one for orders naming the tenant to set", w)
	}
	c = mustParse(t, "upstream: http://u\nqueues:\n  - {name: orders, rate: 1/s, tenant: [header:X-API-Key]}\n  - {name: reports, rate: 1/s}\n"+rules)
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("warnings %q with a tenant", w)
	}
}

// TestShippedExamples checks every config under examples/: it loads without warnings, each
// queue has a tenant, and the job API of each queue with a target is limited by a rule.
func TestShippedExamples(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) < 2 {
		t.Fatalf("examples: %v", files)
	}
	for _, f := range files {
		c, err := Load(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if w := c.Warnings(); len(w) > 0 {
			t.Errorf("%s: warnings %q", f, w)
		}
		for _, q := range c.Queues {
			if len(q.Tenant) == 0 {
				t.Errorf("%s: queue %q has no tenant", f, q.Name)
			}
			if q.Target == nil {
				continue
			}
			limited := false
			for _, r := range c.Rules {
				limited = limited || r.Algorithm != "" && r.Match.Matches("POST", "/v1/queues/"+q.Name+"/jobs")
			}
			if !limited {
				t.Errorf("%s: the job API of queue %q is not limited by any rule", f, q.Name)
			}
		}
	}
}
