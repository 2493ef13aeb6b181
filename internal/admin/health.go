package admin

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sluice-rl/sluice/queue"
)

// Worker is one worker process as it announces itself (every 5 s, in the presence bucket).
type Worker struct {
	ID       string    `json:"id"`
	Host     string    `json:"host,omitempty"`
	PID      int       `json:"pid,omitempty"`
	Version  string    `json:"version,omitempty"`
	Queues   []string  `json:"queues"`
	Started  time.Time `json:"started,omitzero"`
	LastSeen time.Time `json:"last_seen"`
	// Answers are the worker's cumulative delivery counters per queue, from its presence
	// entry; nil from workers that do not write them. The history reads them; /v1/health
	// does not show them.
	Answers map[string]Answers `json:"-"`
}

// anonymous is w without what names its machine: its host name, its process id, and its id
// but the random suffix that tells it from the others ("web-3-4711-1a2b3c4d" reads
// "1a2b3c4d"), for readers without the admin token.
func (w Worker) anonymous() Worker {
	if i := strings.LastIndexByte(w.ID, '-'); i >= 0 {
		w.ID = w.ID[i+1:]
	}
	w.Host, w.PID = "", 0
	return w
}

// Answers are a worker's delivery attempts of one queue since it started, cumulative.
type Answers struct {
	// Delivered counts every attempt; R429 and R5xx those answered 429 and 5xx.
	Delivered, R429, R5xx uint64
	// TimeInQueue counts the attempts by time from the job's acceptance, in the buckets of
	// History.TimeInQueueBounds and one more for longer (trailing empty buckets may be left off).
	TimeInQueue []uint64
}

// Health serves GET /v1/health: everything an operator checks first, in one read.
//
//	{"status":"ok"|"degraded",
//	 "checks":[{"name","ok","latency_ms","error"}],   Redis, NATS, … timed now
//	 "workers":[Worker…],                             the processes draining, by last seen
//	 "queues":[{"name","paused","paused_until","runtime_rate","effective_rate",
//	            "paused_tenants":{id:until},"tenant_overrides":N}]}
//
// Check errors, workers_error and the workers' host, pid and full id are shown to holders of
// the admin token only (Server.SetToken): they name addresses and machines. tenant_overrides
// counts the tenants with settings of their own; GET /v1/queues/{queue}/tenants/{id} shows
// one's. It costs the checks, one read of the presence bucket and of the controls, and the Redis reads
// of each queue's upstream pause: no stream reads.
type Health struct {
	// Server's checks are run and timed. Required.
	Server *Server
	// Queues supplies the config, controls and pauses. Required.
	Queues *Queues
	// Workers lists the worker processes. Optional: nil lists none.
	Workers func(ctx context.Context) ([]Worker, error)
}

// Mount serves GET /v1/health on s.
func (h *Health) Mount(s *Server) { s.Handle("GET /v1/health", http.HandlerFunc(h.serve)) }

type checkView struct {
	Name      string  `json:"name"`
	OK        bool    `json:"ok"`
	LatencyMS float64 `json:"latency_ms"`
	Error     string  `json:"error,omitempty"`
}

type queueHealth struct {
	Name            string               `json:"name"`
	Paused          bool                 `json:"paused"`
	PausedUntil     *time.Time           `json:"paused_until"`
	RuntimeRate     *string              `json:"runtime_rate"`
	Rate            string               `json:"rate"`
	EffectiveRate   float64              `json:"effective_rate"`
	PausedTenants   map[string]time.Time `json:"paused_tenants,omitempty"`
	TenantOverrides int                  `json:"tenant_overrides,omitempty"`
}

type healthView struct {
	Status      string        `json:"status"`
	Checks      []checkView   `json:"checks"`
	Workers     []Worker      `json:"workers"`
	WorkerError string        `json:"workers_error,omitempty"`
	Queues      []queueHealth `json:"queues"`
}

func (h *Health) serve(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), h.Server.checkTimeout)
	defer cancel()
	holder := h.Server.holder(r)
	out := healthView{Status: "ok", Checks: h.checks(ctx), Workers: []Worker{}, Queues: []queueHealth{}}
	for i, c := range out.Checks {
		if !c.OK {
			out.Status = "degraded"
			if !holder {
				out.Checks[i].Error = unavailable
			}
		}
	}
	if h.Workers != nil {
		ws, err := h.Workers(ctx)
		if err != nil {
			out.WorkerError = unavailable
			if holder {
				out.WorkerError = err.Error()
			}
		} else {
			sort.Slice(ws, func(i, j int) bool { return ws[i].LastSeen.After(ws[j].LastSeen) })
			if !holder {
				for i := range ws {
					ws[i] = ws[i].anonymous()
				}
			}
			out.Workers = ws
		}
	}
	out.Queues = h.queues(ctx)
	writeJSON(w, http.StatusOK, out)
}

// checks runs the server's checks at once, each timed.
func (h *Health) checks(ctx context.Context) []checkView {
	out := make([]checkView, len(h.Server.checks))
	var wg sync.WaitGroup
	for i, c := range h.Server.checks {
		wg.Go(func() {
			start := time.Now()
			err := c.Func(ctx)
			v := checkView{Name: c.Name, OK: err == nil, LatencyMS: float64(time.Since(start).Microseconds()) / 1000}
			if err != nil {
				v.Error = err.Error()
			}
			out[i] = v
		})
	}
	wg.Wait()
	return out
}

// queues reads each queue's pauses, rates and tenant settings.
func (h *Health) queues(ctx context.Context) []queueHealth {
	q := h.Queues
	var controls map[string]queue.Control
	if q.Controls != nil {
		controls, _ = q.Controls(ctx)
	}
	var counts map[string]int
	if q.TenantCounts != nil {
		counts, _ = q.TenantCounts(ctx)
	}
	now := q.now()
	cfg := q.Config()
	out := make([]queueHealth, 0, len(cfg.Queues))
	for i := range cfg.Queues {
		cq := &cfg.Queues[i]
		c := controls[cq.Name]
		v := queueHealth{Name: cq.Name, Rate: cq.Rate.String()}
		v.EffectiveRate, v.Paused = q.allowed(ctx, cq, c, now)
		if c.Rate != "" {
			rt := c.Rate
			v.RuntimeRate = &rt
		}
		if c.PausedAt(now) && !c.PausedUntil.IsZero() {
			u := c.PausedUntil.UTC()
			v.PausedUntil = &u
		} else if v.Paused && q.PausedUntil != nil {
			if until, ok, err := q.PausedUntil(ctx, cq.Name); err == nil && ok {
				u := until.UTC()
				v.PausedUntil = &u
			}
		}
		v.TenantOverrides = len(c.Tenants)
		if counts != nil {
			v.TenantOverrides = counts[cq.Name]
		}
		if q.PausedTenants != nil {
			if paused, err := q.PausedTenants(ctx, cq.Name); err == nil && len(paused) > 0 {
				v.PausedTenants = make(map[string]time.Time, len(paused))
				for id, d := range paused {
					v.PausedTenants[id] = now.Add(d).UTC()
				}
			}
		}
		out = append(out, v)
	}
	return out
}
