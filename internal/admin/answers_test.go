package admin

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var testBounds = []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, time.Second, 10 * time.Second}

func ans(n, r429, r5xx uint64, tiq ...uint64) Answers {
	return Answers{Delivered: n, R429: r429, R5xx: r5xx, TimeInQueue: tiq}
}

// answerDeltas sums what each worker counted since the previous sample; a worker whose
// counters cannot be differenced (restarted under its id, counters reset, first seen long
// after its start) adds nothing that interval rather than a negative or inflated figure.
func TestAnswerDeltas(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	prevAt := t0.Add(time.Minute)
	prev := map[string]workerMark{
		"a": {started: t0, answers: map[string]Answers{"q": ans(10, 1, 2, 5, 5)}},
		"b": {started: t0, answers: map[string]Answers{"q": ans(100, 0, 0, 100)}},
	}
	for _, tc := range []struct {
		name   string
		prevAt time.Time
		cur    []Worker
		want   map[string]Answers
	}{
		{"steady: two workers summed", prevAt, []Worker{
			{ID: "a", Started: t0, Answers: map[string]Answers{"q": ans(20, 3, 2, 5, 10, 5)}},
			{ID: "b", Started: t0, Answers: map[string]Answers{"q": ans(110, 1, 1, 105, 5), "r": ans(4, 0, 4, 4)}},
		}, map[string]Answers{"q": ans(20, 3, 1, 5, 10, 5), "r": ans(4, 0, 4, 4)}},
		{"restart under the same id (new started): skipped", prevAt, []Worker{
			{ID: "a", Started: prevAt.Add(time.Second), Answers: map[string]Answers{"q": ans(3, 3, 0, 3)}},
			{ID: "b", Started: t0, Answers: map[string]Answers{"q": ans(101, 0, 0, 101)}},
		}, map[string]Answers{"q": ans(1, 0, 0, 1)}},
		{"counters went down with the same started: skipped", prevAt, []Worker{
			{ID: "a", Started: t0, Answers: map[string]Answers{"q": ans(4, 0, 0, 4)}},
		}, map[string]Answers{}},
		{"a bucket went down: skipped", prevAt, []Worker{
			{ID: "a", Started: t0, Answers: map[string]Answers{"q": ans(11, 1, 2, 6, 4, 1)}},
		}, map[string]Answers{}},
		{"new worker started in the interval: counted from zero", prevAt, []Worker{
			{ID: "c", Started: prevAt.Add(time.Second), Answers: map[string]Answers{"q": ans(7, 7, 0, 0, 7)}},
		}, map[string]Answers{"q": ans(7, 7, 0, 0, 7)}},
		{"new worker started before the previous sample: skipped", prevAt, []Worker{
			{ID: "d", Started: t0, Answers: map[string]Answers{"q": ans(7, 7, 0, 7)}},
		}, map[string]Answers{}},
		{"worker without answers (older version): ignored", prevAt, []Worker{
			{ID: "a", Started: t0},
		}, map[string]Answers{}},
		{"no previous sample: nothing summed", time.Time{}, []Worker{
			{ID: "a", Started: t0, Answers: map[string]Answers{"q": ans(20, 3, 2, 20)}},
		}, map[string]Answers{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, marks := answerDeltas(prev, tc.prevAt, tc.cur)
			if len(got) != len(tc.want) {
				t.Fatalf("sums = %v, want %v", got, tc.want)
			}
			for q, w := range tc.want {
				g := got[q]
				if g.Delivered != w.Delivered || g.R429 != w.R429 || g.R5xx != w.R5xx ||
					!slices.Equal(trim(g.TimeInQueue), trim(w.TimeInQueue)) {
					t.Errorf("queue %s: sum = %+v, want %+v", q, g, w)
				}
			}
			for _, w := range tc.cur {
				if _, ok := marks[w.ID]; ok != (w.Answers != nil) {
					t.Errorf("worker %s marked = %v, want %v", w.ID, ok, w.Answers != nil)
				}
			}
		})
	}
}

func trim(s []uint64) []uint64 {
	for len(s) > 0 && s[len(s)-1] == 0 {
		s = s[:len(s)-1]
	}
	return s
}

// No attempt in the interval leaves every figure null; attempts give the shares.
func TestAnswerFiguresShares(t *testing.T) {
	var p Point
	answerFigures(&p, Answers{}, testBounds)
	if p.R429Share != nil || p.R5xxShare != nil || p.TiqP50Ms != nil || p.TiqP99Ms != nil {
		t.Errorf("no attempts: figures %v %v %v %v, want all null", p.R429Share, p.R5xxShare, p.TiqP50Ms, p.TiqP99Ms)
	}
	answerFigures(&p, ans(8, 2, 1), testBounds)
	if p.R429Share == nil || *p.R429Share != 0.25 || p.R5xxShare == nil || *p.R5xxShare != 0.125 {
		t.Fatalf("8 attempts, 2 × 429, 1 × 5xx: shares %v %v, want 0.25 and 0.125", p.R429Share, p.R5xxShare)
	}
	if p.TiqP50Ms != nil {
		t.Errorf("no time in queue counted: p50 = %v, want null", *p.TiqP50Ms)
	}
}

// p50 and p99 read off the buckets lie within the width of the bucket that holds the true
// percentile of the times counted; one in the open last bucket is its lower bound.
func TestAnswerFiguresPercentilesWithinABucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, spread := range []time.Duration{50 * time.Millisecond, 800 * time.Millisecond, 9 * time.Second} {
		times := make([]time.Duration, 5000)
		counts := make([]uint64, len(testBounds)+1)
		for i := range times {
			times[i] = time.Duration(rng.ExpFloat64() * float64(spread))
			b := 0
			for b < len(testBounds) && times[i] > testBounds[b] {
				b++
			}
			counts[b]++
		}
		slices.Sort(times)
		var p Point
		answerFigures(&p, Answers{Delivered: uint64(len(times)), TimeInQueue: counts}, testBounds)
		for _, c := range []struct {
			q   float64
			got *float64
		}{{0.50, p.TiqP50Ms}, {0.99, p.TiqP99Ms}} {
			truth := times[int(c.q*float64(len(times)))-1]
			lo, hi := bucketOf(truth)
			if c.got == nil {
				t.Fatalf("spread %v: p%v null", spread, c.q*100)
			}
			g := time.Duration(*c.got * float64(time.Millisecond))
			if g < lo-time.Millisecond || (hi > 0 && g > hi+time.Millisecond) {
				t.Errorf("spread %v: p%v = %v, true %v: not within its bucket [%v, %v]", spread, c.q*100, g, truth, lo, hi)
			}
		}
	}
	// All in the open bucket: the lower bound, 10 s.
	var p Point
	answerFigures(&p, ans(3, 0, 0, 0, 0, 0, 0, 3), testBounds)
	if p.TiqP99Ms == nil || *p.TiqP99Ms != 10000 {
		t.Errorf("all past the last bound: p99 = %v, want 10000", p.TiqP99Ms)
	}
}

// bucketOf is the bucket of testBounds holding d: [lo, hi], hi 0 for the open one.
func bucketOf(d time.Duration) (lo, hi time.Duration) {
	for _, b := range testBounds {
		if d <= b {
			return lo, b
		}
		lo = b
	}
	return lo, 0
}
