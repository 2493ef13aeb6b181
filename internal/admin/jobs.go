package admin

import (
	"context"
	"math"
	"net/http"
	"strconv"

	"golang.org/x/time/rate"

	"github.com/sluice-rl/sluice/queue"
)

// JobBrowser pages through a queue's jobs; *queue.Queues implements it.
type JobBrowser interface {
	// Browse returns a page of queue's jobs (see queue.Queues.Browse).
	Browse(ctx context.Context, queue string, q queue.BrowseQuery) (queue.Page, error)
}

var _ JobBrowser = (*queue.Queues)(nil)

// Jobs serves the job browser of the admin API:
//
//	GET /v1/queues/{queue}/jobs?state=S&tenant=T&cursor=C&limit=N
//	    {"queue","state","source","jobs":[job…],"next":C,"scanned":N}; next is 0 on the last page
//
// state picks where the jobs are read (queue.Browse): "" (every job still in the queue),
// queued, running or retrying from the queue's stream; failed or dead from the dead-letter
// stream; succeeded, canceled or all (every recorded state) from the status bucket. tenant
// is a tenant id or, with the admin token, a tenant's value. A job's detail is GET /v1/jobs/{id}; cancel and replay
// are DELETE /v1/jobs/{id} and POST /v1/queues/{queue}/dead-letters/replay.
//
// What a page costs NATS is bounded (queue.Browse): at most queue.DefaultMaxGets direct gets
// of waiting jobs or dead letters, or queue.DefaultMaxScan status entries through one
// consumer that the page deletes. Pages are bounded too: PagesPerSecond over every reader
// together, beyond which a page is refused with 429 and a Retry-After.
type Jobs struct {
	// Q pages through the jobs. Required.
	Q JobBrowser
	// Queues supplies the config and the tenant ids. Required.
	Queues *Queues
	// PagesPerSecond bounds the pages served, with a burst of twice as many. 0:
	// DefaultPagesPerSecond.
	PagesPerSecond float64

	pages *rate.Limiter
}

// DefaultPagesPerSecond is the job browser's pages per second when Jobs sets none: the
// dashboard turns a page at a click, a script pages through a large queue in seconds.
const DefaultPagesPerSecond = 10

// Mount mounts the job browser on s.
func (j *Jobs) Mount(s *Server) {
	pps := j.PagesPerSecond
	if pps <= 0 {
		pps = DefaultPagesPerSecond
	}
	j.pages = rate.NewLimiter(rate.Limit(pps), int(math.Ceil(2*pps)))
	s.Handle("GET /v1/queues/{queue}/jobs", http.HandlerFunc(j.list))
}

// admit reports whether a page may be served now; when not it has answered 429.
func (j *Jobs) admit(w http.ResponseWriter) bool {
	rv := j.pages.Reserve()
	if d := rv.Delay(); d > 0 {
		rv.Cancel()
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.Seconds()))))
		writeProblem(w, http.StatusTooManyRequests, "Too many pages",
			"the job browser serves "+strconv.FormatFloat(float64(j.pages.Limit()), 'f', -1, 64)+" pages per second over all its readers; try again after Retry-After")
		return false
	}
	return true
}

// sourceOf maps the state asked for to where it is read, and the state to keep there.
func sourceOf(state string) (string, queue.State, bool) {
	switch state {
	case "":
		return queue.SourceWaiting, "", true
	case string(queue.StateQueued), string(queue.StateRunning), string(queue.StateRetrying):
		return queue.SourceWaiting, queue.State(state), true
	case string(queue.StateFailed), "dead":
		return queue.SourceDead, "", true
	case string(queue.StateSucceeded), string(queue.StateCanceled):
		return queue.SourceStatus, queue.State(state), true
	case "all":
		return queue.SourceStatus, "", true
	}
	return "", "", false
}

func (j *Jobs) list(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	if _, ok := j.Queues.Config().Queue(name); !ok {
		writeProblem(w, http.StatusNotFound, "Unknown queue", "no queue named "+strconv.Quote(name))
		return
	}
	if !j.admit(w) {
		return
	}
	qv := r.URL.Query()
	state := qv.Get("state")
	src, st, ok := sourceOf(state)
	if !ok {
		writeProblem(w, http.StatusBadRequest, "Bad request", "state: want queued, running, retrying, failed, dead, succeeded, canceled or all, got "+strconv.Quote(state))
		return
	}
	bq := queue.BrowseQuery{Source: src, State: st}
	if s := qv.Get("cursor"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "Bad request", "cursor: want the next of a page")
			return
		}
		bq.Cursor = n
	}
	if s := qv.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeProblem(w, http.StatusBadRequest, "Bad request", "limit: want 1 to 1000")
			return
		}
		bq.Limit = n
	}
	if t := qv.Get("tenant"); t != "" {
		id, ok := j.Queues.tenantIDOf(w, r, t)
		if !ok {
			return
		}
		bq.Tenant = id
	}
	page, err := j.Q.Browse(r.Context(), name, bq)
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Queue  string `json:"queue"`
		State  string `json:"state"`
		Source string `json:"source"`
		queue.Page
	}{name, state, src, page})
}
