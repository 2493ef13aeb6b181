package ingress

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/limit"
)

// TestDecideRuling is the decision table of the gate: each charged rule's decision and where it
// came from, in; the verdict, the rule deferred to, the violations, Retry-After and the policy
// the headers report, out.
func TestDecideRuling(t *testing.T) {
	plain := &rule{name: "plain", hasLimit: true}
	other := &rule{name: "other", hasLimit: true}
	shadow := &rule{name: "shadow", hasLimit: true, shadow: true}
	enqueue := &rule{name: "enqueue", hasLimit: true, onLimitEnqueue: true}
	action := &rule{name: "action", actionEnqueue: true}
	shadowAction := &rule{name: "shadow-action", actionEnqueue: true, shadow: true}

	allow := func(rem int64) limit.Decision {
		return limit.Decision{Allowed: true, Limit: 10, Remaining: rem, ResetAfter: time.Second}
	}
	deny := func(retry time.Duration) limit.Decision {
		return limit.Decision{Limit: 10, RetryAfter: retry, ResetAfter: 2 * time.Second}
	}
	type in struct {
		rule *rule
		d    limit.Decision
		src  source
	}
	for _, tc := range []struct {
		name    string
		charged []in
		matched []*rule // besides the charged ones
		noDefer bool
		want    verdict
		deferTo *rule
		viol    []*rule
		retry   time.Duration
		header  int
	}{
		{name: "allowed", charged: []in{{plain, allow(3), fromStore}}, want: forward, header: 0},
		{name: "closest to exhaustion reports", charged: []in{{plain, allow(3), fromStore}, {other, allow(1), fromStore}}, want: forward, header: 1},
		{name: "one violated rejects", charged: []in{{plain, allow(3), fromStore}, {other, deny(time.Second), fromStore}},
			want: reject, viol: []*rule{other}, retry: time.Second, header: 1},
		{name: "the longest Retry-After", charged: []in{{plain, deny(time.Second), fromStore}, {other, deny(3 * time.Second), fromStore}},
			want: reject, viol: []*rule{plain, other}, retry: 3 * time.Second, header: 0},
		{name: "shadow never restricts", charged: []in{{shadow, deny(time.Second), fromStore}}, want: forward, header: 0},
		{name: "fail open allows, reports nothing", charged: []in{{plain, limit.Decision{}, failedOpen}}, want: forward, header: -1},
		{name: "fail closed", charged: []in{{plain, limit.Decision{}, failedClosed}, {other, allow(5), fromStore}}, want: failClosed, header: 1},
		{name: "reject beats fail closed", charged: []in{{plain, limit.Decision{}, failedClosed}, {other, deny(time.Second), fromStore}},
			want: reject, viol: []*rule{other}, retry: time.Second, header: 1},
		{name: "fallback decides", charged: []in{{plain, deny(time.Second), fromFallback}}, want: reject, viol: []*rule{plain}, retry: time.Second, header: 0},
		{name: "over the limit with on_limit enqueue defers", charged: []in{{enqueue, deny(time.Second), fromStore}}, want: deferIt, deferTo: enqueue, header: 0},
		{name: "a rejecting rule beats deferral", charged: []in{{enqueue, deny(time.Second), fromStore}, {plain, deny(2 * time.Second), fromStore}},
			want: reject, viol: []*rule{plain}, retry: 2 * time.Second, header: 1},
		{name: "job API: on_limit enqueue rejects instead", charged: []in{{enqueue, deny(time.Second), fromStore}}, noDefer: true,
			want: reject, viol: []*rule{enqueue}, retry: time.Second, header: 0},
		{name: "action enqueue defers an allowed request", charged: []in{{plain, allow(2), fromStore}}, matched: []*rule{action}, want: deferIt, deferTo: action, header: 0},
		{name: "shadow action enqueue does not", charged: []in{{plain, allow(2), fromStore}}, matched: []*rule{shadowAction}, want: forward, header: 0},
		{name: "job API: action enqueue forwards", matched: []*rule{action}, noDefer: true, want: forward, header: -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var matched []*rule
			var charges []charge
			for _, c := range tc.charged {
				charges = append(charges, charge{rule: c.rule, dec: c.d, src: c.src})
				matched = append(matched, c.rule)
			}
			matched = append(matched, tc.matched...)
			rl := decideRuling(charges, matched, !tc.noDefer, nil)
			deferTo := rl.deferTo
			if rl.action != deferIt {
				deferTo = nil // a candidate only; nothing is deferred
			}
			if rl.action != tc.want || deferTo != tc.deferTo || rl.retryAfter != tc.retry || rl.header != tc.header {
				t.Errorf("ruling %+v, want action %v, defer to %v, retry %v, header %d", rl, tc.want, tc.deferTo, tc.retry, tc.header)
			}
			if len(rl.viol) != len(tc.viol) {
				t.Fatalf("violations %d, want %d", len(rl.viol), len(tc.viol))
			}
			for i := range rl.viol {
				if rl.viol[i] != tc.viol[i] {
					t.Errorf("violation %d: %s, want %s", i, rl.viol[i].name, tc.viol[i].name)
				}
			}
		})
	}
}

// TestHeaderPolicy: the rate-limit headers report the policy that binds, so that a client can
// pace on it — as examples/llm.yaml's clients must on tokens: the rule that deferred the
// request, else the violated or decided rule with the smallest share of its limit left, not
// the fewest units left.
func TestHeaderPolicy(t *testing.T) {
	requests := &rule{name: "requests-per-key", hasLimit: true}                   // 60/m, rejects
	tokens := &rule{name: "tokens-per-key", hasLimit: true, onLimitEnqueue: true} // 20 000/m, defers
	other := &rule{name: "other", hasLimit: true}                                 // 20 000/m, rejects
	shadow := &rule{name: "shadow", hasLimit: true, shadow: true}                 // 60/m
	action := &rule{name: "action", actionEnqueue: true}                          // no limit

	dec := func(allowed bool, left, of int64, reset time.Duration) limit.Decision {
		return limit.Decision{Allowed: allowed, Limit: of, Remaining: left, ResetAfter: reset}
	}
	type in struct {
		rule *rule
		d    limit.Decision
		src  source
	}
	for _, tc := range []struct {
		name    string
		charged []in
		matched []*rule // besides the charged ones
		noDefer bool
		want    verdict
		header  int
	}{
		{name: "LLM: the token rule deferred the request",
			charged: []in{{requests, dec(true, 59, 60, time.Second), fromStore}, {tokens, dec(false, 15000, 20000, 15*time.Second), fromStore}},
			want:    deferIt, header: 1},
		{name: "deferred from a cached rejection",
			charged: []in{{requests, dec(true, 1, 60, time.Minute), fromStore}, {tokens, dec(false, 0, 20000, time.Second), fromCache}},
			want:    deferIt, header: 1},
		{name: "allowed: the smallest share left, not the fewest units",
			charged: []in{{requests, dec(true, 59, 60, time.Minute), fromStore}, {tokens, dec(true, 100, 15000, time.Minute), fromStore}},
			want:    forward, header: 1},
		{name: "allowed: fewer units left can be the larger share",
			charged: []in{{requests, dec(true, 5, 60, time.Minute), fromStore}, {tokens, dec(true, 10000, 20000, time.Minute), fromStore}},
			want:    forward, header: 0},
		{name: "allowed: the same share, the longest reset",
			charged: []in{{requests, dec(true, 30, 60, time.Second), fromStore}, {tokens, dec(true, 10000, 20000, time.Minute), fromStore}},
			want:    forward, header: 1},
		{name: "allowed: a shadow rule closest to exhaustion reports",
			charged: []in{{requests, dec(true, 30, 60, time.Second), fromStore}, {shadow, dec(false, 0, 60, time.Second), fromStore}},
			want:    forward, header: 1},
		{name: "429: the rule that refused, not the deferring one",
			charged: []in{{requests, dec(false, 0, 60, time.Second), fromStore}, {tokens, dec(false, 100, 20000, time.Minute), fromStore}},
			want:    reject, header: 0},
		{name: "429: among the refusing rules, the smallest share left",
			charged: []in{{requests, dec(false, 0, 60, time.Second), fromStore}, {other, dec(false, 19000, 20000, time.Minute), fromStore}},
			want:    reject, header: 0},
		{name: "429: the same share, the longest reset",
			charged: []in{{requests, dec(false, 0, 60, time.Second), fromStore}, {other, dec(false, 0, 20000, time.Minute), fromStore}},
			want:    reject, header: 1},
		{name: "job API: the token rule refused",
			charged: []in{{requests, dec(true, 59, 60, time.Second), fromStore}, {tokens, dec(false, 15000, 20000, 15*time.Second), fromStore}},
			noDefer: true, want: reject, header: 1},
		{name: "deferred by an action rule without a limit: the smallest share left",
			charged: []in{{requests, dec(true, 59, 60, time.Second), fromStore}, {other, dec(true, 100, 20000, time.Second), fromStore}},
			matched: []*rule{action}, want: deferIt, header: 1},
		{name: "503: among the rules that decided",
			charged: []in{{requests, limit.Decision{}, failedClosed}, {tokens, dec(true, 100, 20000, time.Second), fromStore}, {other, dec(true, 19000, 20000, time.Second), fromStore}},
			want:    failClosed, header: 1},
		{name: "counts near 2^52 compare exactly",
			charged: []in{{other, dec(true, 1<<52-1, 1<<52, time.Second), fromStore}, {tokens, dec(true, 1<<52-2, 1<<52-1, time.Second), fromStore}},
			want:    forward, header: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var matched []*rule
			var charges []charge
			for _, c := range tc.charged {
				charges = append(charges, charge{rule: c.rule, dec: c.d, src: c.src})
				matched = append(matched, c.rule)
			}
			rl := decideRuling(charges, append(matched, tc.matched...), !tc.noDefer, nil)
			if rl.action != tc.want || rl.header != tc.header {
				name := "none"
				if rl.header >= 0 {
					name = charges[rl.header].rule.name
				}
				t.Errorf("verdict %v, headers of %d (%s); want verdict %v, headers of %d", rl.action, rl.header, name, tc.want, tc.header)
			}
		})
	}
}

// TestLogDecisions: with log_decisions, each charged rule's decision is logged with a hash of
// its key (never the key itself), its outcome and the status of the answer.
func TestLogDecisions(t *testing.T) {
	var buf bytes.Buffer
	f := newFixture(t, `
log_decisions: true
rules:
  - { name: per-key, match: { path: /api/* }, key: [header:X-API-Key], algorithm: fixed_window, limit: 1, period: 1h }
`, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	f.do("GET", "/api/x", nil, "X-API-Key", "secret-key-123")
	f.do("GET", "/api/x", nil, "X-API-Key", "secret-key-123")
	out := buf.String()
	for _, want := range []string{"rule=per-key", "outcome=allowed", "outcome=rejected", "status=429", "key="} {
		if !strings.Contains(out, want) {
			t.Errorf("decision log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret-key-123") {
		t.Errorf("decision log shows the key itself:\n%s", out)
	}
}
