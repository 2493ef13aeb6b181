package config

import (
	"fmt"
	"net/textproto"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Who may claim priority. A queue's priorities key is either true (levels, and any client may
// ask for Sluice-Priority: high, as before) or a mapping that names who may:
//
//	priorities:
//	  high: [tenant:gold-key, header:X-Tier=gold, rule:urgent-orders]
//	  others: normal          # normal (default): delivered at normal | refuse: 403
//
// tenant:VALUE is a tenant by its value, as weights names it; header:NAME=VALUE and
// query:NAME=VALUE a request whose every value of that header or parameter is VALUE; rule:NAME
// the requests deferred by that rule, which are delivered at high (a deferral carries no
// Sluice-Priority of its client's). Anyone may ask for low: it only moves the asker back.

// PriorityOthers is what a request for high from anyone priorities.high does not name gets.
type PriorityOthers string

const (
	// PriorityOthersNormal delivers the job at normal priority (the default).
	PriorityOthersNormal PriorityOthers = "normal"
	// PriorityOthersRefuse refuses the job with 403.
	PriorityOthersRefuse PriorityOthers = "refuse"
)

// PriorityClaims says who may claim high priority on a queue (YAML priorities as a mapping).
type PriorityClaims struct {
	// Tenants are tenant values (as weights name them) that may ask for high.
	Tenants []string
	// Keys are request parts (header:NAME or query:NAME) with the value that may ask for high.
	Keys []KeyValue
	// Rules are the rules whose deferrals are delivered at high.
	Rules []string
	// Others is what any other request for high gets.
	Others PriorityOthers
}

// KeyValue is a request part with a value: header:X-Tier=gold.
type KeyValue struct {
	Part  KeyPart
	Value string
}

// rawPriorities is a queue's priorities as the file has it: a single value (true or false) or
// a mapping of high and others. Anything else is kept as problems for build to report.
type rawPriorities struct {
	flag   *scalar
	high   stringList
	others *scalar
	bad    []string // problems found while decoding, with the field they are about
}

// UnmarshalYAML implements yaml.Unmarshaler. It never fails: see bad.
func (p *rawPriorities) UnmarshalYAML(n *yaml.Node) error {
	*p = rawPriorities{}
	switch n.Kind {
	case yaml.ScalarNode:
		p.flag = &scalar{text: n.Value}
		return nil
	case yaml.MappingNode:
	default:
		p.bad = append(p.bad, "priorities: want true, false or a mapping of high and others, not "+kindName(n.Kind))
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		switch k, v := n.Content[i].Value, n.Content[i+1]; k {
		case "high":
			_ = p.high.UnmarshalYAML(v) // never fails
		case "others":
			p.others = new(scalar)
			_ = p.others.UnmarshalYAML(v)
		default:
			p.bad = append(p.bad, fmt.Sprintf("priorities: unknown field %q: want high or others", k))
		}
	}
	return nil
}

// priorities reads a queue's priorities: whether it has levels, and who may claim high.
func (b *builder) priorities(where string, q *Queue, r *rawPriorities) {
	if r == nil {
		return
	}
	for _, msg := range r.bad {
		b.p.add(where, "priorities", msg)
	}
	if r.flag != nil {
		q.Priorities = b.boolean(where, "priorities", r.flag)
		return
	}
	if len(r.bad) > 0 {
		return
	}
	q.Priorities = true
	c := &PriorityClaims{Others: PriorityOthers(b.text(where, "priorities.others", r.others, string(PriorityOthersNormal)))}
	if c.Others != PriorityOthersNormal && c.Others != PriorityOthersRefuse {
		b.p.addf(where, "priorities.others", "priorities.others: want normal or refuse, got %q", c.Others)
	}
	for j, s := range b.list(where, "priorities.high", r.high) {
		field := fmt.Sprintf("priorities.high[%d]", j)
		kind, arg, _ := strings.Cut(s, ":")
		switch kind {
		case "tenant":
			if arg == "" {
				b.p.add(where, field, field+`: "tenant:" needs a tenant value`)
			}
			c.Tenants = append(c.Tenants, arg)
		case "rule":
			if arg == "" {
				b.p.add(where, field, field+`: "rule:" needs a rule name`)
			}
			c.Rules = append(c.Rules, arg)
		case "header", "query":
			name, value, ok := strings.Cut(arg, "=")
			if !ok || name == "" || value == "" {
				b.p.addf(where, field, "%s: want %s:NAME=VALUE, got %q", field, kind, s)
				continue
			}
			part := KeyPart{Kind: KeyKind(kind), Name: name}
			if kind == "header" {
				if !isToken(name) {
					b.p.addf(where, field, "%s: invalid header name %q", field, name)
				}
				part.Name = textproto.CanonicalMIMEHeaderKey(name)
			}
			c.Keys = append(c.Keys, KeyValue{Part: part, Value: value})
		default:
			b.p.addf(where, field, "%s: want tenant:VALUE, header:NAME=VALUE, query:NAME=VALUE or rule:NAME, got %s", field, strconv.Quote(s))
		}
	}
	q.PriorityClaims = c
}

// checkPriorityRules reports a priorities.high rule: entry that names no rule deferring to
// its queue, and tenant: entries of a queue without tenants.
func (b *builder) checkPriorityRules(c *Config) {
	for i := range c.Queues {
		q := &c.Queues[i]
		if q.PriorityClaims == nil {
			continue
		}
		if len(q.PriorityClaims.Tenants) > 0 && len(q.Tenant) == 0 {
			b.p.add(place("queues", i, q.Name), "priorities.high", "priorities.high: tenant: entries need the queue's tenant")
		}
		for _, name := range q.PriorityClaims.Rules {
			found := false
			for _, r := range c.Rules {
				found = found || r.Name == name && r.Queue == q.Name
			}
			if !found && name != "" {
				b.p.addf(place("queues", i, q.Name), "priorities.high", "priorities.high: rule:%s names no rule that defers to this queue", name)
			}
		}
	}
}
