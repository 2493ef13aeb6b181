package config

import (
	"strings"
	"testing"
	"time"
)

func TestRegionsConfig(t *testing.T) {
	const queue = "queues:\n  - {name: llm, rate: 50/s, global: true}\n"
	ok := "region: eu\nregions: {names: [eu, us], coordinator: nats://127.0.0.1:4222, home: eu, safe_share: 0, min_share: 2/s, lease: 8s}\n" + queue
	c, err := Parse("sluice.yaml", []byte(ok), func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	r := c.Regions
	if c.Region != "eu" || r == nil || r.Home != "eu" || r.SafeEven || r.SafeRate.N != 0 || r.MinShare.PerSecond() != 2 ||
		r.Lease != 8*time.Second || r.Renew != 2*time.Second || !c.Queues[0].Global {
		t.Fatalf("parsed %q %+v, global %v", c.Region, r, c.Queues[0].Global)
	}
	// docs/regions.md's two-region recipe parses.
	recipe := "region: a\nregions:\n  names: [a, b]\n  coordinator: nats://regions:regions@127.0.0.1:4222\n  home: a\n" +
		"  lease: 4s\n  renew: 1s\n" +
		"listen: 127.0.0.1:8080\nadmin_listen: 127.0.0.1:9090\nnats: {url: nats://a:a@127.0.0.1:4222}\n" +
		"redis: {url: redis://127.0.0.1:6379/0}\nqueues:\n  - {name: llm, rate: 50/s, global: true, target: http://127.0.0.1:9999/}\n"
	if _, err := Parse("a.yaml", []byte(recipe), func(string) string { return "" }); err != nil {
		t.Fatalf("the recipe's a.yaml: %v", err)
	}
	// A global rule.
	rule := "upstream: http://127.0.0.1:9/\nrules:\n  - {name: per-key, key: [header:X-Key], algorithm: gcra, limit: 1000, period: 1m, global: true}\n"
	if c, err := Parse("sluice.yaml", []byte(ok+rule), func(string) string { return "" }); err != nil || !c.Rules[0].Global {
		t.Fatalf("a global rule: %v", err)
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"global rule without regions", rule, `rules[0] "per-key": global: true shares the rule's limit with other regions`},
		{"global concurrency rule", ok + "upstream: http://127.0.0.1:9/\nrules:\n  - {name: c, algorithm: concurrency, limit: 5, global: true}\n",
			`rules[0] "c": global: true shares a limit per period`},
		{"global rule's name", ok + strings.Replace(rule, "per-key", "per key", 1), `global: true names the rule's lease on the coordinator`},
		{"global without regions", queue, `queues[0] "llm": global: true shares the queue's rate with other regions: set region: NAME`},
		{"region without regions", "region: eu\n", "region and regions go together"},
		{"bad safe share", "region: eu\nregions: {names: [eu], coordinator: nats://h:4222, safe_share: half}\n", `regions.safe_share: want even, 0 or a rate such as 10/s, got "half"`},
		{"region not listed", "region: eu\nregions: {names: [us], coordinator: nats://h:4222}\n", `regions.names: the region "eu" is not among [us]`},
		{"no coordinator", "region: eu\nregions: {names: [eu]}\n", "regions.coordinator is required"},
		{"renew not shorter", "region: eu\nregions: {names: [eu], coordinator: nats://h:4222, lease: 2s, renew: 2s}\n", "regions.renew (2s) must be shorter than regions.lease (2s)"},
		{"bad home", "region: eu\nregions: {names: [eu], coordinator: nats://h:4222, home: 'e u'}\n", `regions.home: want the NATS cluster name of the home region`},
		{"unknown key", "region: eu\nregions: {names: [eu], coordinator: nats://h:4222, leases: 2s}\n", "leases"},
		{"bad region name", "region: e u\nregions: {names: [eu], coordinator: nats://h:4222}\n", `region: want 1 to 32`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("sluice.yaml", []byte(tc.yaml), func(string) string { return "" })
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "sluice.yaml") {
				t.Fatalf("error %v; want one naming sluice.yaml and %q", err, tc.want)
			}
		})
	}
}
