package config

import "fmt"

// Warnings returns what in c is valid but likely wrong, one sentence each, for the process to
// log when it loads or reloads the file:
//
//   - a queue that a rule keyed by a header or query parameter (an API key) feeds, with
//     action: enqueue or on_limit: enqueue, and that has no tenant: every client of the queue
//     shares one Idempotency-Key space and sees every job's status, so a key that one client
//     takes first turns another's request into a 422.
//   - a queue with priorities: true: any client may claim high priority (priorities as a
//     mapping names who may).
//   - a queue with tenants that leaves pause_scope to its default (queue): one tenant's
//     upstream 429 or 503 pauses every tenant of the queue, for as long as its Retry-After
//     says (an hour, if the upstream says so). pause_scope: queue, set, silences it: an
//     upstream whose limit is the account's, not the key's, wants the whole queue paused.
func (c *Config) Warnings() []string {
	var out []string
	for i := range c.Queues {
		q := &c.Queues[i]
		if q.Priorities && q.PriorityClaims == nil {
			out = append(out, fmt.Sprintf("%s: %s: priorities: true lets any client ask for Sluice-Priority: high and go before everyone else; name who may with priorities: {high: [tenant:VALUE, header:NAME=VALUE, rule:NAME]}",
				c.Path, place("queues", i, q.Name)))
		}
		if len(q.Tenant) > 0 {
			if !q.pauseScopeSet {
				out = append(out, fmt.Sprintf("%s: %s: has tenants but no pause_scope: an upstream 429 or 503 on one tenant's job pauses every tenant of the queue for its Retry-After; set pause_scope: tenant (with fair: true) to pause that tenant only, or pause_scope: queue to keep this",
					c.Path, place("queues", i, q.Name)))
			}
			continue
		}
		for _, r := range c.Rules {
			if r.Queue != q.Name || r.Action != ActionEnqueue && r.OnLimit != OnLimitEnqueue {
				continue
			}
			if p, ok := clientKey(r.Key); ok {
				out = append(out, fmt.Sprintf("%s: %s: fed by rule %q, keyed by %s, but has no tenant: its clients share Idempotency-Keys and job statuses; set tenant: [%s]",
					c.Path, place("queues", i, q.Name), r.Name, p, p))
				break
			}
		}
	}
	return out
}

// clientKey returns the first key part that names a client by what it sends (header:NAME,
// query:NAME), and whether there is one.
func clientKey(parts []KeyPart) (KeyPart, bool) {
	for _, p := range parts {
		if p.Kind == KeyHeader || p.Kind == KeyQuery {
			return p, true
		}
	}
	return KeyPart{}, false
}
