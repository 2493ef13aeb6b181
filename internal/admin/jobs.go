package admin

import (
	"context"
	"net/http"
	"strconv"

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
type Jobs struct {
	// Q pages through the jobs. Required.
	Q JobBrowser
	// Queues supplies the config and the tenant ids. Required.
	Queues *Queues
}

// Mount mounts the job browser on s.
func (j *Jobs) Mount(s *Server) {
	s.Handle("GET /v1/queues/{queue}/jobs", http.HandlerFunc(j.list))
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
