package ingress

import (
	"fmt"
	"net/http"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// Who may claim priority (config.PriorityClaims). A direct job that asks for high
// (Sluice-Priority) keeps it when its queue names no claims (priorities: true), or when its
// tenant, or the value of a header or query parameter it carries, is named; otherwise it is
// delivered at normal (its 202 says so: Sluice-Priority: normal), or refused with 403
// (others: refuse). A deferral by a rule that the
// queue names is delivered at high. Asking for low is anyone's.

// errPriorityRefused is the answer to a claim of high that the queue refuses.
func errPriorityRefused(q string) *Problem {
	return &Problem{Type: "about:blank", Title: "Priority not granted", Status: http.StatusForbidden,
		Detail: fmt.Sprintf("queue %q takes %s: high only from the tenants, keys and rules its priorities name; send normal or low, or none", q, hdrPriority)}
}

// claimPriority returns the priority job p of tenant gets on queue q from request r: p, or
// normal for an unnamed claim of high, or the 403 problem when q refuses such claims.
func (g *gate) claimPriority(q *config.Queue, r *http.Request, tenant string, p queue.Priority) (queue.Priority, error) {
	c := q.PriorityClaims
	if p != queue.PriorityHigh || c == nil || g.named(c, r, tenant) {
		return p, nil
	}
	if c.Others == config.PriorityOthersRefuse {
		return "", errPriorityRefused(q.Name)
	}
	return queue.PriorityNormal, nil
}

// named reports whether c names the asker: its tenant (by tenant id, derived as a weights
// entry's), or a header or query parameter whose every value is the named one.
func (g *gate) named(c *config.PriorityClaims, r *http.Request, tenant string) bool {
	if tenant != "" && g.enqueuer != nil {
		for _, v := range c.Tenants {
			if id, err := g.enqueuer.TenantID([]byte(v)); err == nil && id == tenant {
				return true
			}
		}
	}
	for _, kv := range c.Keys {
		var vs []string
		if kv.Part.Kind == config.KeyHeader {
			vs = r.Header.Values(kv.Part.Name)
		} else {
			vs = r.URL.Query()[kv.Part.Name]
		}
		all := len(vs) > 0
		for _, v := range vs {
			all = all && v == kv.Value
		}
		if all {
			return true
		}
	}
	return false
}

// rulePriority is the priority of a deferral by rule into q: high when q's priorities name
// the rule, else normal.
func rulePriority(q *config.Queue, rule string) queue.Priority {
	if c := q.PriorityClaims; c != nil {
		for _, name := range c.Rules {
			if name == rule {
				return queue.PriorityHigh
			}
		}
	}
	return queue.PriorityNormal
}
