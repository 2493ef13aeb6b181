// Package workertest holds what the worker's tests share: a recording upstream that notes the
// arrival instant and content of every delivery, helpers to publish a backlog, and the
// statistics the rate tests assert on. It is for tests only.
package workertest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// Arrival is one request the Recorder received.
type Arrival struct {
	At      time.Time // when the handler was entered
	ID      string    // the Sluice-Job header: the job id
	Attempt int       // the Sluice-Attempt header; 0 when absent or malformed
	Method  string
	URI     string // the request URI: path and query
	Header  http.Header
	Body    []byte
	Status  int // the status the upstream answered, where it reports it (0: not known)
}

// Reply is what the Recorder answers to one request.
type Reply struct {
	Status int         // 0: 200
	Header http.Header // added to the response
	// Block, if not nil, delays the answer until it is closed or the request is cancelled.
	Block <-chan struct{}
	// Body is the answer's body; nil: none.
	Body []byte
}

// Recorder is an upstream that records every request. It answers 200 unless Respond says
// otherwise. It is safe for concurrent use.
type Recorder struct {
	// URL is the base URL of the server, without a trailing slash.
	URL string

	srv      *httptest.Server
	mu       sync.Mutex
	arrivals []Arrival
	respond  func(a Arrival, nth int) Reply
	perID    map[string]int
	notify   chan struct{}
}

// NewRecorder starts a Recorder, closed when the test ends.
func NewRecorder(t testing.TB) *Recorder {
	r := &Recorder{perID: map[string]int{}, notify: make(chan struct{}, 1)}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	t.Cleanup(r.srv.Close)
	return r
}

// Respond sets how the Recorder answers: f gets the arrival and how many requests with its
// job id arrived so far, this one included (1 for the first).
func (r *Recorder) Respond(f func(a Arrival, nth int) Reply) {
	r.mu.Lock()
	r.respond = f
	r.mu.Unlock()
}

func (r *Recorder) serve(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, _ := io.ReadAll(req.Body)
	a := Arrival{
		At: at, ID: req.Header.Get("Sluice-Job"), Method: req.Method, URI: req.RequestURI,
		Header: req.Header.Clone(), Body: body,
	}
	a.Attempt, _ = strconv.Atoi(req.Header.Get("Sluice-Attempt"))
	r.mu.Lock()
	r.arrivals = append(r.arrivals, a)
	r.perID[a.ID]++
	nth, respond := r.perID[a.ID], r.respond
	r.mu.Unlock()
	select {
	case r.notify <- struct{}{}:
	default:
	}
	reply := Reply{Status: http.StatusOK}
	if respond != nil {
		reply = respond(a, nth)
	}
	if reply.Block != nil {
		select {
		case <-reply.Block:
		case <-req.Context().Done():
			return
		}
	}
	for k, v := range reply.Header {
		w.Header()[k] = v
	}
	if reply.Status == 0 {
		reply.Status = http.StatusOK
	}
	w.WriteHeader(reply.Status)
	w.Write(reply.Body)
}

// Arrivals returns a copy of every arrival so far, in arrival order.
func (r *Recorder) Arrivals() []Arrival {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.arrivals)
}

// Count returns how many requests arrived.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.arrivals)
}

// Distinct returns how many distinct job ids arrived.
func (r *Recorder) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.perID)
}

// PerID returns how many requests arrived for each job id.
func (r *Recorder) PerID() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.perID))
	for k, v := range r.perID {
		out[k] = v
	}
	return out
}

// WaitCount waits until cond holds for the number of arrivals, or fails the test after
// timeout.
func (r *Recorder) WaitCount(t testing.TB, timeout time.Duration, what string, cond func(n int) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if cond(r.Count()) {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s (%d arrivals)", timeout, what, r.Count())
		case <-r.notify:
		case <-tick.C:
		}
	}
}

// Publish publishes n jobs to queue with 8 publishers at once and returns their ids in
// publish order of their index. Direct jobs carry the body "job-<i>" with Content-Type
// text/plain; deferred ones are POST /orders/<i>?n=<i> with that body and an X-Test header.
func Publish(t testing.TB, qs *queue.Queues, queueName string, n int, direct bool) []string {
	t.Helper()
	ids := make([]string, n)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				job := &queue.Job{
					Queue:  queueName,
					Direct: direct,
					Header: http.Header{"Content-Type": {"text/plain"}},
					Body:   []byte(fmt.Sprintf("job-%d", i)),
				}
				if !direct {
					job.Method = http.MethodPost
					job.Path = fmt.Sprintf("/orders/%d?n=%d", i, i)
					job.Header.Set("X-Test", strconv.Itoa(i))
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				rc, err := qs.Publish(ctx, job)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				ids[i] = rc.ID
			}
		}()
	}
	for i := range n {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			t.Fatalf("publish: %v", err)
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("publish: %v", err)
	default:
	}
	return ids
}

// Times returns the arrival instants, sorted.
func Times(as []Arrival) []time.Time {
	ts := make([]time.Time, len(as))
	for i, a := range as {
		ts[i] = a.At
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return ts
}

// Rate is the achieved rate of sorted instants ts in events per second: (n-1) intervals over
// the span from the first to the last. It is 0 for fewer than two instants.
func Rate(ts []time.Time) float64 {
	if len(ts) < 2 {
		return 0
	}
	span := ts[len(ts)-1].Sub(ts[0])
	if span <= 0 {
		return 0
	}
	return float64(len(ts)-1) / span.Seconds()
}

// MaxWindow is the largest number of sorted instants ts in any half-open window [t, t+w).
// Windows starting at an instant are enough: sliding a window's start forward to the first
// instant it holds never loses one.
func MaxWindow(ts []time.Time, w time.Duration) int {
	best, j := 0, 0
	for i := range ts {
		if j < i {
			j = i
		}
		for j < len(ts) && ts[j].Sub(ts[i]) < w {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// Gaps returns the largest gap between consecutive sorted instants after from, and where it
// starts. from.IsZero() means from the first instant.
func Gaps(ts []time.Time, from time.Time) (gap time.Duration, at time.Time) {
	for i := 1; i < len(ts); i++ {
		if ts[i-1].Before(from) {
			continue
		}
		if d := ts[i].Sub(ts[i-1]); d > gap {
			gap, at = d, ts[i-1]
		}
	}
	return gap, at
}
