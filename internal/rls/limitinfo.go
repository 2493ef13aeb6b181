package rls

// limitinfo.go: what an answer says of a limit (current_limit, the RateLimit headers, the
// quota metadata), built once per policy and spec and shared.

import (
	"math"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rl/sluice/limit"
)

// currentLimit is currentLimit(p.name, spec), built once per policy and spec and then shared
// by the answers (a message only read, as gRPC's marshalling does, may be shared). A policy
// backed by a rule keeps the latest spec: a reload that changes the rule builds it again.
func (p *policy) currentLimit(spec limit.Limit) *rlsv3.RateLimitResponse_RateLimit {
	if p.cl == nil {
		return currentLimit(p.name, spec)
	}
	return p.cached(spec).rl
}

// limitHeaders are the RateLimit-Policy and X-RateLimit-Limit headers of p under spec, shared
// by the answers as currentLimit is.
func (p *policy) limitHeaders(spec limit.Limit) (policy, lim *corev3.HeaderValue) {
	if p.cl == nil {
		return limitHeaders(p, spec)
	}
	c := p.cached(spec)
	return c.policyHdr, c.limitHdr
}

// cached returns p's cachedLimit for spec, building it when the cache holds another. p.cl is
// not nil.
func (p *policy) cached(spec limit.Limit) *cachedLimit {
	if c := p.cl.Load(); c != nil && c.spec == spec {
		return c
	}
	c := &cachedLimit{spec: spec, rl: currentLimit(p.name, spec)}
	c.policyHdr, c.limitHdr = limitHeaders(p, spec)
	p.cl.Store(c)
	return c
}

// cachedLimit is what a policy's answers share for one spec: its current_limit, and its
// RateLimit-Policy and X-RateLimit-Limit headers.
type cachedLimit struct {
	spec                limit.Limit
	rl                  *rlsv3.RateLimitResponse_RateLimit
	policyHdr, limitHdr *corev3.HeaderValue
}

// currentLimit is spec as the protocol states a limit: the largest unit the period is a whole
// number of, and that number as the multiplier. A period under a second is stated per second.
func currentLimit(name string, spec limit.Limit) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: uint32(min(max(spec.Limit, 0), math.MaxUint32)),
		Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
	for _, u := range []struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY}, {time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE}, {time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND}} {
		if spec.Period >= u.d && spec.Period%u.d == 0 {
			rl.Unit = u.unit
			if n := spec.Period / u.d; n > 1 {
				rl.UnitMultiplier = wrapU32(uint32(min(n, math.MaxUint32)))
			}
			break
		}
	}
	return rl
}

// quotaMetadata adds descriptor i of a quota_mode limit to md as envoyproxy/ratelimit reports
// them in dynamic_metadata: quotaModeEnabled, and the indexes of those over the limit in
// quotaModeViolations.
func quotaMetadata(md *structpb.Struct, i int, violated bool) *structpb.Struct {
	if md == nil {
		md = &structpb.Struct{Fields: map[string]*structpb.Value{
			"quotaModeEnabled":    structpb.NewBoolValue(true),
			"quotaModeViolations": structpb.NewListValue(&structpb.ListValue{}),
		}}
	}
	if violated {
		l := md.Fields["quotaModeViolations"].GetListValue()
		l.Values = append(l.Values, structpb.NewNumberValue(float64(i)))
	}
	return md
}

func wrapU32(v uint32) *wrapperspb.UInt32Value { return wrapperspb.UInt32(v) }
