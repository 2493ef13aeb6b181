package rls

import (
	"strings"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// match finds the policy of one request descriptor in domain as envoyproxy/ratelimit does:
// at each depth the entry's "key_value" first, then the first wildcard "key_prefix*" of the
// level above whose prefix it has, then the bare "key"; a policy counts only at the depth of
// the descriptor's last entry. nil: no limit applies. shared holds, for the entries matched by
// a wildcard with share_threshold, the wildcard's value ("prefix*"), which the counter key
// then uses in place of the entry's value so that all such values count together; nil when
// there are none.
func (d *Domains) match(domain string, desc *rlcommon.RateLimitDescriptor) (found *policy, shared []string) {
	n := d.byName[domain]
	if n == nil {
		return nil, nil
	}
	entries := desc.GetEntries()
	var buf [128]byte // "key_value" is built here: a map lookup of string(bytes) does not copy
	for i, e := range entries {
		kb := append(append(append(buf[:0], e.GetKey()...), '_'), e.GetValue()...)
		next := n.children[string(kb)]
		if next == nil && len(n.wildcards) > 0 {
			k := string(kb)
			for _, w := range n.wildcards {
				if strings.HasPrefix(k, strings.TrimSuffix(w, "*")) {
					next = n.children[w]
					if next.share {
						if shared == nil {
							shared = make([]string, len(entries))
						}
						shared[i] = strings.TrimPrefix(w, e.GetKey()+"_")
					}
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.GetKey()]
		}
		if next == nil {
			break
		}
		if next.lim != nil && i == len(entries)-1 {
			found = next.lim
		}
		if len(next.children) == 0 {
			break
		}
		n = next
	}
	return found, shared
}
