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
		return limit.Decision{Allowed: true, Remaining: rem, ResetAfter: time.Second}
	}
	deny := func(retry time.Duration) limit.Decision {
		return limit.Decision{RetryAfter: retry, ResetAfter: 2 * time.Second}
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
