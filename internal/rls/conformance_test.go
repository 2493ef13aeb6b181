package rls

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/internal/testenv"
)

// conformanceDomain follows the shapes of envoyproxy/ratelimit's own test configurations
// (test/config/basic_config.yaml and its wildcard, replaces, shadow and unlimited cases), in
// its own format, plus a descriptor backed by a Sluice rule. Counters that several steps share
// have windows of an hour or a day, so that no step straddles the end of a window (aligned to
// the epoch).
const conformanceDomain = `domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: key4
    rate_limit: {unit: day, requests_per_unit: 4}
  - key: key5
    value: value5
    rate_limit: {unlimited: true}
  - key: key6
    value: foo*
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: key6
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key7
    value: bar*
    share_threshold: true
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: shadow
    value: "on"
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: replaced
    rate_limit: {unit: day, requests_per_unit: 1, name: small}
  - key: replacer
    rate_limit: {unit: day, requests_per_unit: 100, name: big, replaces: [{name: small}]}
  - key: zero
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: quota
    quota_mode: true
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: check
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: unlimited-but-replaced
    rate_limit: {unlimited: true, name: small}
  - key: tokens
    rule: tokens-per-key
  - key: shadowed
    rule: shadowed
`

// want is the expected status of one descriptor: its code, and the limit it reports (0: no
// current_limit at all), and what remains.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	limit     uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	remaining uint32
}

var (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
	sec  = rlsv3.RateLimitResponse_RateLimit_SECOND
	mnt  = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hr   = rlsv3.RateLimitResponse_RateLimit_HOUR
	day  = rlsv3.RateLimitResponse_RateLimit_DAY
)

func hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func negative(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.IsNegativeHits = true
	return hits(d, n)
}

func overrideTo(d *rlcommon.RateLimitDescriptor, n uint32, u typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: u}
	return d
}

// TestConformance runs the steps in order against one service: each step's counts follow
// from the steps before it.
func TestConformance(t *testing.T) {
	b := start(t, map[string]string{"test.yaml": conformanceDomain})
	steps := []struct {
		name  string
		hits  uint32
		descs []*rlcommon.RateLimitDescriptor
		want  []want
	}{
		{"nested: first", 0, ds(desc("key1", "value1", "subkey1", "a")), ws(want{ok, 5, hr, 4})},
		{"nested: second", 0, ds(desc("key1", "value1", "subkey1", "a")), ws(want{ok, 5, hr, 3})},
		{"nested: another value of the bare key counts apart", 0, ds(desc("key1", "value1", "subkey1", "b")), ws(want{ok, 5, hr, 4})},
		{"nested: hits_addend on the request", 3, ds(desc("key1", "value1", "subkey1", "a")), ws(want{ok, 5, hr, 0})},
		{"nested: over", 0, ds(desc("key1", "value1", "subkey1", "a")), ws(want{over, 5, hr, 0})},
		{"depth: a parent without a limit of its own", 0, ds(desc("key1", "value1")), ws(want{code: ok})},
		{"depth: more entries than the config", 0, ds(desc("key2", "x", "extra", "y")), ws(want{code: ok})},
		{"most specific: key_value beats key", 0, ds(desc("key2", "value2")), ws(want{ok, 30, mnt, 29})},
		{"most specific: the bare key for other values", 0, ds(desc("key2", "other")), ws(want{ok, 20, mnt, 19})},
		{"wildcard: foo*", 0, ds(desc("key6", "foobar")), ws(want{ok, 2, day, 1})},
		{"wildcard: each value counts apart", 0, ds(desc("key6", "foobaz")), ws(want{ok, 2, day, 1})},
		{"wildcard: no prefix, the bare key", 0, ds(desc("key6", "bar")), ws(want{ok, 10, mnt, 9})},
		{"wildcard: over", 1, ds(hits(desc("key6", "foobar"), 2)), ws(want{over, 2, day, 0})},
		{"share_threshold: values of the wildcard count together", 0, ds(desc("key7", "bar1")), ws(want{ok, 2, day, 1})},
		{"share_threshold: another value, same counter", 0, ds(desc("key7", "bar2")), ws(want{ok, 2, day, 0})},
		{"share_threshold: over", 0, ds(desc("key7", "bar3")), ws(want{over, 2, day, 0})},
		{"unlimited", 0, ds(desc("key5", "value5")), ws(want{ok, 0, 0, math.MaxUint32})},
		{"shadow: within", 0, ds(desc("shadow", "on")), ws(want{ok, 1, day, 0})},
		{"shadow: over, still OK", 0, ds(desc("shadow", "on")), ws(want{ok, 1, day, 0})},
		{"shadow: a Sluice rule's shadow", 0, ds(desc("shadowed", "x"), desc("shadowed", "x")), ws(want{ok, 1, hr, 0}, want{ok, 1, hr, 0})},
		{"replaces: the named limit is not applied", 0, ds(desc("replaced", "a"), desc("replacer", "b")), ws(want{code: ok}, want{ok, 100, day, 99})},
		{"replaces: alone it applies", 0, ds(desc("replaced", "a")), ws(want{ok, 1, day, 0})},
		{"replaces: alone, over", 0, ds(desc("replaced", "a")), ws(want{over, 1, day, 0})},
		{"replaces: replaced even when over", 0, ds(desc("replaced", "a"), desc("replacer", "b")), ws(want{code: ok}, want{ok, 100, day, 98})},
		{"hits_addend: request level", 2, ds(desc("key3", "x")), ws(want{ok, 3, hr, 1})},
		{"hits_addend: descriptor level beats the request's", 3, ds(hits(desc("key3", "x"), 1)), ws(want{ok, 3, hr, 0})},
		{"hits_addend: over", 0, ds(desc("key3", "x")), ws(want{over, 3, hr, 0})},
		{"negative hits: charge 3 of 4", 3, ds(desc("key4", "x")), ws(want{ok, 4, day, 1})},
		{"negative hits: give 2 back", 0, ds(negative(desc("key4", "x"), 2)), ws(want{ok, 4, day, 3})},
		{"negative hits: 3 fit again", 3, ds(desc("key4", "x")), ws(want{ok, 4, day, 0})},
		{"negative hits: nothing left to give back beyond what was charged", 0, ds(negative(desc("key4", "y"), 5)), ws(want{ok, 4, day, 0})},
		{"limit override", 0, ds(overrideTo(desc("key2", "zzz"), 1, typev3.RateLimitUnit_DAY)), ws(want{ok, 1, day, 0})},
		{"limit override: over", 0, ds(overrideTo(desc("key2", "zzz"), 1, typev3.RateLimitUnit_DAY)), ws(want{over, 1, day, 0})},
		{"limit override: an unknown descriptor gets it too", 0, ds(overrideTo(desc("nokey", "v"), 2, typev3.RateLimitUnit_HOUR)), ws(want{ok, 2, hr, 1})},
		{"limit override: no shadow_mode of the file", 0, ds(overrideTo(desc("shadow", "on"), 1, typev3.RateLimitUnit_DAY)), ws(want{over, 1, day, 0})},
		{"quota_mode: within", 0, ds(desc("quota", "q")), ws(want{ok, 1, day, 0})},
		{"quota_mode: over, OK", 0, ds(desc("quota", "q")), ws(want{ok, 1, day, 0})},
		{"hits_addend 0: a check charges nothing", 0, ds(hits(desc("check", "c"), 0)), ws(want{ok, 2, day, 2})},
		{"hits_addend 0: so both still fit", 2, ds(desc("check", "c")), ws(want{ok, 2, day, 0})},
		{"hits_addend 0: a full key is OK to a check", 0, ds(hits(desc("check", "c"), 0)), ws(want{ok, 2, day, 0})},
		{"unlimited: stays unlimited when replaced", 0, ds(desc("unlimited-but-replaced", "u"), desc("replacer", "b")), ws(want{ok, 0, 0, math.MaxUint32}, want{ok, 100, day, 97})},
		{"requests_per_unit 0 blocks", 0, ds(desc("zero", "v")), ws(want{over, 0, sec, 0})},
		{"a Sluice rule: token bucket, weighted", 0, ds(hits(desc("tokens", "k"), 10)), ws(want{ok, 10, mnt, 0})},
		{"a Sluice rule: over", 0, ds(desc("tokens", "k")), ws(want{over, 10, mnt, 0})},
		{"a Sluice rule: a cost over capacity is refused, never charged", 0, ds(hits(desc("tokens", "other"), 11)), ws(want{over, 10, mnt, 0})},
		{"several: one over makes the whole answer over", 0, ds(desc("key2", "q"), desc("tokens", "k")), ws(want{ok, 20, mnt, 19}, want{over, 10, mnt, 0})},
		{"unknown descriptor", 0, ds(desc("nokey", "v")), ws(want{code: ok})},
	}
	for _, s := range steps {
		resp := b.ask(t, "test-domain", s.hits, s.descs...)
		wantOverall := ok
		for i, w := range s.want {
			st := resp.Statuses[i]
			if w.code == over {
				wantOverall = over
			}
			if st.Code != w.code || st.LimitRemaining != w.remaining {
				t.Errorf("%s: status %d: code %v remaining %d, want %v %d", s.name, i, st.Code, st.LimitRemaining, w.code, w.remaining)
			}
			switch {
			case w.limit == 0 && w.unit == 0 && st.CurrentLimit != nil:
				t.Errorf("%s: status %d: current_limit %v, want none", s.name, i, st.CurrentLimit)
			case w.unit != 0 && (st.CurrentLimit.GetRequestsPerUnit() != w.limit || st.CurrentLimit.GetUnit() != w.unit):
				t.Errorf("%s: status %d: current_limit %v, want %d per %v", s.name, i, st.CurrentLimit, w.limit, w.unit)
			}
			if st.CurrentLimit != nil && st.Code == over && st.DurationUntilReset.AsDuration() <= 0 && w.limit > 0 {
				t.Errorf("%s: status %d: duration_until_reset %v on OVER_LIMIT", s.name, i, st.DurationUntilReset.AsDuration())
			}
		}
		if resp.OverallCode != wantOverall {
			t.Errorf("%s: overall %v, want %v", s.name, resp.OverallCode, wantOverall)
		}
		if wantOverall == over && len(resp.RawBody) == 0 {
			t.Errorf("%s: OVER_LIMIT without raw_body", s.name)
		}
	}
	if got := testenv.Metric(t, b.reg, "sluice_decisions_total", "rule", "tokens-per-key", "outcome", "rejected"); got != 3 {
		t.Errorf("sluice_decisions_total{rule=tokens-per-key,outcome=rejected} = %v, want 3", got)
	}
	if got := testenv.Metric(t, b.reg, "sluice_decisions_total", "rule", "shadowed", "outcome", "shadow"); got != 1 {
		t.Errorf("sluice_decisions_total{rule=shadowed,outcome=shadow} = %v, want 1", got)
	}
}

func ds(d ...*rlcommon.RateLimitDescriptor) []*rlcommon.RateLimitDescriptor { return d }
func ws(w ...want) []want                                                   { return w }

// TestOverLimitAnswer: an OVER_LIMIT carries the HTTP path's headers and its problem+json,
// and an OK the RateLimit headers of the tightest descriptor.
func TestOverLimitAnswer(t *testing.T) {
	b := start(t, map[string]string{"test.yaml": conformanceDomain})
	resp := b.ask(t, "test-domain", 0, hits(desc("key3", "h"), 2), desc("key2", "h"))
	hdr := headerMap(resp)
	// A fixed window is aligned to the epoch: t is what is left of the current hour.
	if !strings.HasPrefix(hdr["RateLimit"], `"rls:test-domain.key3";r=1;t=`) || hdr["RateLimit-Policy"] != `"rls:test-domain.key3";q=3;w=3600` {
		t.Errorf("OK headers %v: want the tightest descriptor's (key3, 1 left)", hdr)
	}
	if _, has := hdr["Retry-After"]; has || resp.RawBody != nil {
		t.Errorf("OK answer with Retry-After or body: %v %q", hdr, resp.RawBody)
	}
	resp = b.ask(t, "test-domain", 0, hits(desc("key3", "h"), 2))
	hdr = headerMap(resp)
	if resp.OverallCode != over || hdr["Retry-After"] == "" || hdr["Content-Type"] != "application/problem+json" ||
		!strings.HasPrefix(hdr["RateLimit"], `"rls:test-domain.key3";r=0;t=`) {
		t.Fatalf("OVER_LIMIT answer %v headers %v", resp.OverallCode, hdr)
	}
	var p struct {
		Type       string   `json:"type"`
		Status     int      `json:"status"`
		Violated   []string `json:"violated-policies"`
		RetryAfter int64    `json:"retry_after"`
	}
	if err := json.Unmarshal(resp.RawBody, &p); err != nil {
		t.Fatalf("raw_body %q: %v", resp.RawBody, err)
	}
	wait := resp.Statuses[0].DurationUntilReset.AsDuration()
	if p.Status != 429 || len(p.Violated) != 1 || p.Violated[0] != "rls:test-domain.key3" || p.RetryAfter < 1 ||
		p.RetryAfter > int64((wait+time.Second-1)/time.Second) || !strings.Contains(p.Type, "quota-exceeded") {
		t.Errorf("raw_body %s (reset in %v)", resp.RawBody, wait)
	}
}

// TestQuotaModeMetadata: a quota_mode descriptor over its limit answers OK and is named in
// dynamic_metadata, as envoyproxy/ratelimit reports it.
func TestQuotaModeMetadata(t *testing.T) {
	b := start(t, map[string]string{"test.yaml": conformanceDomain})
	first := b.ask(t, "test-domain", 0, desc("key2", "m"), desc("quota", "m"))
	if v := first.DynamicMetadata.GetFields()["quotaModeViolations"].GetListValue().GetValues(); len(v) != 0 ||
		!first.DynamicMetadata.GetFields()["quotaModeEnabled"].GetBoolValue() {
		t.Fatalf("within the quota: %v", first.DynamicMetadata)
	}
	second := b.ask(t, "test-domain", 0, desc("key2", "m"), desc("quota", "m"))
	v := second.DynamicMetadata.GetFields()["quotaModeViolations"].GetListValue().GetValues()
	if second.OverallCode != ok || len(v) != 1 || v[0].GetNumberValue() != 1 {
		t.Fatalf("over the quota: %v %v", second.OverallCode, second.DynamicMetadata)
	}
	if got := testenv.Metric(t, b.reg, "sluice_decisions_total", "rule", "rls:test-domain.quota", "outcome", "shadow"); got != 1 {
		t.Errorf("quota-mode violation counted as %v shadow decisions, want 1", got)
	}
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		m[h.Key] = h.Value
	}
	return m
}
