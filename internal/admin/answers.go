package admin

import (
	"math"
	"time"
)

// The workers' answers in the history: every worker's presence entry carries its cumulative
// Answers per queue (attempts, 429s, 5xx, time in queue in fixed buckets). At each sample
// the history sums, per queue, what every worker counted since the previous sample, and
// turns the sum into the interval's 429 and 5xx shares and time-in-queue p50 and p99.

// workerMark is what the history remembers of a worker's entry at the previous sample.
type workerMark struct {
	started time.Time
	answers map[string]Answers
}

// answerDeltas sums per queue the attempts the workers cur made since the previous sample,
// whose marks are prev, taken at prevAt (zero: there was none, so nothing is summed). A
// worker counts from its mark when its Started is the mark's and no counter went down; from
// zero when it is new and started at or after prevAt; otherwise (a restart under the same
// id, counters reset, an entry first seen long after its start) it is skipped this interval.
// It returns the sums and the marks of cur for the next sample.
func answerDeltas(prev map[string]workerMark, prevAt time.Time, cur []Worker) (map[string]Answers, map[string]workerMark) {
	sums := map[string]Answers{}
	marks := make(map[string]workerMark, len(cur))
	for _, w := range cur {
		if w.Answers == nil {
			continue // a worker that does not count its answers
		}
		marks[w.ID] = workerMark{started: w.Started, answers: w.Answers}
		if prevAt.IsZero() {
			continue
		}
		var base map[string]Answers
		m, seen := prev[w.ID]
		switch {
		case seen && m.started.Equal(w.Started):
			base = m.answers
		case !seen && !w.Started.IsZero() && !w.Started.Before(prevAt):
			base = nil // started within the interval: everything it counted is new
		default:
			continue
		}
		d, ok := diffAnswers(w.Answers, base)
		if !ok {
			continue // a counter went down: the worker's counters were reset
		}
		for q, a := range d {
			sums[q] = addAnswers(sums[q], a)
		}
	}
	return sums, marks
}

// diffAnswers is cur − base per queue; false when any counter of cur is below base's.
func diffAnswers(cur, base map[string]Answers) (map[string]Answers, bool) {
	out := make(map[string]Answers, len(cur))
	for q, c := range cur {
		b := base[q]
		if c.Delivered < b.Delivered || c.R429 < b.R429 || c.R5xx < b.R5xx {
			return nil, false
		}
		d := Answers{Delivered: c.Delivered - b.Delivered, R429: c.R429 - b.R429, R5xx: c.R5xx - b.R5xx,
			TimeInQueue: make([]uint64, max(len(c.TimeInQueue), len(b.TimeInQueue)))}
		for i := range d.TimeInQueue {
			ci, bi := at(c.TimeInQueue, i), at(b.TimeInQueue, i)
			if ci < bi {
				return nil, false
			}
			d.TimeInQueue[i] = ci - bi
		}
		out[q] = d
	}
	return out, true
}

func at(s []uint64, i int) uint64 {
	if i < len(s) {
		return s[i]
	}
	return 0
}

// addAnswers is a + b.
func addAnswers(a, b Answers) Answers {
	s := Answers{Delivered: a.Delivered + b.Delivered, R429: a.R429 + b.R429, R5xx: a.R5xx + b.R5xx,
		TimeInQueue: make([]uint64, max(len(a.TimeInQueue), len(b.TimeInQueue)))}
	for i := range s.TimeInQueue {
		s.TimeInQueue[i] = at(a.TimeInQueue, i) + at(b.TimeInQueue, i)
	}
	return s
}

// answerFigures sets p's 429 and 5xx shares from the interval's attempts d, and its time in
// queue p50 and p99 from d's buckets (bounds): all stay nil when d holds no attempt, the
// times when it holds no time in queue.
func answerFigures(p *Point, d Answers, bounds []time.Duration) {
	if d.Delivered == 0 {
		return
	}
	v := new([4]float64) // one allocation for the four figures
	v[0] = math.Round(float64(d.R429)/float64(d.Delivered)*1e4) / 1e4
	v[1] = math.Round(float64(d.R5xx)/float64(d.Delivered)*1e4) / 1e4
	p.R429Share, p.R5xxShare = &v[0], &v[1]
	p50, ok50 := quantile(d.TimeInQueue, bounds, 0.50)
	p99, ok99 := quantile(d.TimeInQueue, bounds, 0.99)
	if ok50 && ok99 {
		v[2], v[3] = p50, p99
		p.TiqP50Ms, p.TiqP99Ms = &v[2], &v[3]
	}
}

// quantile is the q-quantile (0 < q ≤ 1) in milliseconds of the times counted in the buckets
// counts, bucket i holding times up to bounds[i] (the last, past len(bounds), those longer),
// interpolated linearly inside its bucket: exact to the bucket's width. A quantile in the
// open last bucket is its lower bound. False when counts holds nothing.
func quantile(counts []uint64, bounds []time.Duration, q float64) (float64, bool) {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return 0, false
	}
	rank := q * float64(total)
	var cum float64
	for i, c := range counts {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank || i == len(counts)-1 {
			lo := time.Duration(0)
			if i > 0 {
				lo = bounds[min(i, len(bounds))-1]
			}
			if i >= len(bounds) {
				return ms(lo), true
			}
			return ms(lo + time.Duration(float64(bounds[i]-lo)*(rank-cum)/float64(c))), true
		}
		cum += float64(c)
	}
	return 0, false
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e5) / 10 }
