package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
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
	c = mustParse(t, "upstream: http://u\nqueues:\n  - {name: orders, rate: 1/s, tenant: [header:X-API-Key], pause_scope: queue}\n  - {name: reports, rate: 1/s}\n"+rules)
	if w := c.Warnings(); len(w) != 0 {
		t.Fatalf("warnings %q with a tenant", w)
	}
}

// TestWarnTenantsWithoutPauseScope: a queue with tenants and no pause_scope is told at start
// what one tenant's 429 will do; pause_scope set either way silences it.
func TestWarnTenantsWithoutPauseScope(t *testing.T) {
	for _, tc := range []struct {
		queue string
		warns bool
	}{
		{"{name: q, rate: 1/s, tenant: [header:X-API-Key]}", true},
		{"{name: q, rate: 1/s, tenant: [header:X-API-Key], fair: true}", true},
		{"{name: q, rate: 1/s, tenant: [header:X-API-Key], pause_scope: queue}", false},
		{"{name: q, rate: 1/s, tenant: [header:X-API-Key], fair: true, pause_scope: tenant}", false},
		{"{name: q, rate: 1/s}", false},
	} {
		w := mustParse(t, "upstream: http://u\nqueues:\n  - "+tc.queue+"\n").Warnings()
		if got := len(w) == 1 && strings.Contains(w[0], "pauses every tenant of the queue"); got != tc.warns || len(w) > 1 {
			t.Errorf("%s: warnings %q, want the pause_scope warning: %v", tc.queue, w, tc.warns)
		}
	}
}

// TestShippedExamples checks every config that ships — examples/, the compose deployment's
// and the Kubernetes ConfigMap's: it loads without warnings, each queue has a tenant, and the
// job API of each queue with a target is limited by a rule; each queue pauses by tenant and
// bounds what one tenant holds.
func TestShippedExamples(t *testing.T) {
	files, _ := filepath.Glob("../../examples/*.yaml")
	if len(files) < 2 {
		t.Fatalf("examples: %v", files)
	}
	files = append(files, "../../deploy/sluice.yaml", configMapFile(t, "../../deploy/kubernetes/configmap.yaml"))
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
			if q.PauseScope != PauseTenant || q.TenantMaxDepth == 0 {
				t.Errorf("%s: queue %q: pause_scope %q, tenant_max_depth %d; want tenant and a bound", f, q.Name, q.PauseScope, q.TenantMaxDepth)
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

// configMapFile writes the sluice.yaml of the ConfigMap in path to a file of its own, and
// returns the file's path.
func configMapFile(t *testing.T, path string) string {
	t.Helper()
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cm); err != nil || cm.Data["sluice.yaml"] == "" {
		t.Fatalf("%s: no data.sluice.yaml (%v)", path, err)
	}
	out := filepath.Join(t.TempDir(), "configmap-sluice.yaml")
	if err := os.WriteFile(out, []byte(cm.Data["sluice.yaml"]), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPriorityClaims: priorities as a mapping names who may claim high; bad entries are
// named by field; priorities: true still works and is warned about.
func TestPriorityClaims(t *testing.T) {
	const base = "upstream: http://u\nqueues:\n  - {name: q, rate: 1/s, tenant: [header:X-API-Key], pause_scope: queue, priorities: %s}\nrules:\n  - {name: urgent, key: [ip], action: enqueue, queue: q}\n"
	c := mustParse(t, fmt.Sprintf(base, "{high: [tenant:gold-key, header:x-tier=gold, rule:urgent], others: refuse}"))
	pc := c.Queues[0].PriorityClaims
	if !c.Queues[0].Priorities || pc == nil || pc.Others != PriorityOthersRefuse || len(pc.Tenants) != 1 || pc.Tenants[0] != "gold-key" ||
		len(pc.Keys) != 1 || pc.Keys[0].Part.Name != "X-Tier" || pc.Keys[0].Value != "gold" || len(pc.Rules) != 1 {
		t.Fatalf("claims %+v", pc)
	}
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("warnings %q with named claims", w)
	}
	if w := mustParse(t, fmt.Sprintf(base, "true")).Warnings(); len(w) != 1 || !strings.Contains(w[0], "any client") {
		t.Errorf("priorities: true: warnings %q, want one about any client", w)
	}
	for _, tc := range []struct{ value, says string }{
		{"{high: [gold]}", `priorities.high[0]: want tenant:VALUE`},
		{"{high: [header:X-Tier]}", `want header:NAME=VALUE`},
		{"{high: [rule:nope]}", `rule:nope names no rule`},
		{"{others: drop}", `priorities.others: want normal or refuse`},
		{"{hi: [tenant:a]}", `unknown field "hi"`},
		{"[a]", `not a list`},
	} {
		_, err := Parse("sluice.yaml", []byte(fmt.Sprintf(base, tc.value)), nil)
		if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), `queues[0] "q"`) {
			t.Errorf("priorities: %s: %v, want an error naming the queue and %q", tc.value, err, tc.says)
		}
	}
}

// TestMaxWaitingPerKey: a deferring rule's budget, its default from its queue's max_depth,
// and the errors that name the field.
func TestMaxWaitingPerKey(t *testing.T) {
	const base = "upstream: http://u\nqueues:\n  - {name: q, rate: 1/s, max_depth: %d}\nrules:\n  - {name: r, key: [ip], action: enqueue, queue: q%s}\n"
	for _, tc := range []struct {
		depth int
		extra string
		want  int64
	}{
		{100000, "", 1000}, {10000, "", 1000}, {500, "", 50}, {5, "", 1}, {500, ", max_waiting_per_key: 7", 7},
	} {
		c := mustParse(t, fmt.Sprintf(base, tc.depth, tc.extra))
		if got := c.Rules[0].WaitingPerKey(&c.Queues[0]); got != tc.want {
			t.Errorf("max_depth %d%s: budget %d, want %d", tc.depth, tc.extra, got, tc.want)
		}
	}
	for _, tc := range []struct{ yaml, says string }{
		{fmt.Sprintf(base, 10, ", max_waiting_per_key: 0"), `rules[0] "r": max_waiting_per_key`},
		{fmt.Sprintf(base, 10, ", max_waiting_per_key: many"), `rules[0] "r": max_waiting_per_key`},
		{"upstream: http://u\nrules:\n  - {name: r, key: [ip], algorithm: gcra, limit: 1, period: 1s, max_waiting_per_key: 3}\n", `max_waiting_per_key needs a queue`},
	} {
		if _, err := Parse("sluice.yaml", []byte(tc.yaml), nil); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%q: %v, want an error naming %q", tc.yaml, err, tc.says)
		}
	}
}
