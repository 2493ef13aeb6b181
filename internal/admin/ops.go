package admin

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/httphdr"
	"github.com/sluice-rl/sluice/queue"
)

// Ops serves the operating API's writes, and the reads that go with them, on the admin
// listener:
//
//	POST   /v1/queues/{queue}/pause[?for=30s]      stop deliveries on every worker
//	POST   /v1/queues/{queue}/resume               restart them
//	PATCH  /v1/queues/{queue}  {"rate":"40/s"}     runtime rate; {"rate":null} restores the file's
//	GET    /v1/queues/{queue}/dead-letters         the dead letters
//	POST   /v1/queues/{queue}/dead-letters/replay  {"ids":[…]} or no body for all
//	DELETE /v1/queues/{queue}/dead-letters         {"ids":[…]} or no body for all
//	GET    /v1/jobs/{id}                           a job's status, whoever its tenant
//	DELETE /v1/jobs/{id}                           cancel a job not yet delivered
//	GET    /v1/rules                               the rules and their decision counts
//	GET    /ui/                                    the dashboard (static files, embedded)
//
// Writes need "Authorization: Bearer <Token>" when Token is set, and come only from loopback
// peers when it is not; anything else is 401. Before that, the server refuses with 403 a
// write from another site's page and any request for another Host (Server.Handler), token
// or no token. Every write is logged (peer, how it was authorised, what) and counted in
// sluice_admin_writes_total{action,result}, refused ones included. Pause, resume
// and rate are kept in JetStream (queue.Operator.SetControl), so they reach every worker within
// a second and survive restarts.
type Ops struct {
	// Q is the queue layer. Required.
	Q QueueOps
	// Queues answers with a queue's state after a write. Required.
	Queues *Queues
	// Token is the admin token; "" allows writes from loopback peers only.
	Token string
	// Logger receives a line per write. Nil: discarded.
	Logger *slog.Logger
	// Gatherer is the process's metrics, read for the rules' decision counts (GET /v1/rules).
	// Nil: no counts.
	Gatherer prometheus.Gatherer

	writes *prometheus.CounterVec
}

// QueueOps is what the operating API does to the queue layer; *queue.Queues implements it.
// Errors wrapping queue.ErrUnknownQueue and queue.ErrNotFound answer 404, queue.ErrConflict
// 409, anything else 503.
type QueueOps interface {
	// SetControl changes the operators' controls of queue (pause, runtime rate) with change
	// and returns them as stored.
	SetControl(ctx context.Context, queue string, change func(*queue.Control)) (queue.Control, error)
	// SetTenantControl changes the settings of one tenant of queue with change and returns
	// them as stored; queue.ErrTooManyTenants when it would be the max+1th tenant with some.
	SetTenantControl(ctx context.Context, queue, tenant string, max int, change func(*queue.TenantControl)) (queue.TenantControl, error)
	// DeadLetters lists up to limit dead letters of queue, oldest first.
	DeadLetters(ctx context.Context, queue string, limit int) ([]queue.DeadLetter, error)
	// Replay publishes dead letter id of queue again and removes it from the dead letters.
	Replay(ctx context.Context, queue, id string) error
	// PurgeDeadLetters deletes the dead letters ids of queue (nil: all) and returns how many.
	PurgeDeadLetters(ctx context.Context, queue string, ids []string) (int, error)
	// Status reads a job's status, whoever its tenant.
	Status(ctx context.Context, id string) (queue.Status, error)
	// Cancel cancels a job not yet delivered and returns its status.
	Cancel(ctx context.Context, id string) (queue.Status, error)
}

var _ QueueOps = (*queue.Queues)(nil)

// Mount mounts the operating API on s and registers its metric with reg.
func (o *Ops) Mount(s *Server, reg prometheus.Registerer) error {
	o.writes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_admin_writes_total",
		Help: "Writes to the admin API, by action and result (ok, refused: unauthorised, error).",
	}, []string{"action", "result"})
	if reg != nil {
		if err := reg.Register(o.writes); err != nil {
			return err
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	actions := map[string]string{}
	write := func(pattern, action string, h func(w http.ResponseWriter, r *http.Request) error) {
		actions[pattern] = action
		s.Handle(pattern, o.write(action, h))
	}
	write("POST /v1/queues/{queue}/pause", "pause", o.pause)
	write("POST /v1/queues/{queue}/resume", "resume", o.resume)
	write("PATCH /v1/queues/{queue}", "rate", o.rate)
	write("PATCH /v1/queues/{queue}/tenants/{tenant}", "tenant", o.tenantSettings)
	s.Handle("GET /v1/queues/{queue}/dead-letters", http.HandlerFunc(o.deadLetters))
	write("POST /v1/queues/{queue}/dead-letters/replay", "replay", o.replay)
	write("DELETE /v1/queues/{queue}/dead-letters", "purge", o.purge)
	s.Handle("GET /v1/jobs/{id}", http.HandlerFunc(o.job))
	s.Handle("GET /v1/rules", http.HandlerFunc(o.rules))
	s.Handle("GET /ui/", uiHandler())
	s.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusMovedPermanently))
	write("DELETE /v1/jobs/{id}", "cancel", o.cancel)
	s.OnRefuse(func(r *http.Request, why string) {
		_, pattern := s.mux.Handler(r)
		if action := actions[pattern]; action != "" {
			o.writes.WithLabelValues(action, "refused").Inc()
		}
		o.Logger.Warn("admin: request refused", "method", r.Method, "path", r.URL.Path, "host", r.Host,
			"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"), "peer", r.RemoteAddr, "why", why)
	})
	return nil
}

// write guards, logs and counts the write handler h of action.
func (o *Ops) write(action string, h func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		how, ok := o.authorise(r)
		if !ok {
			o.writes.WithLabelValues(action, "refused").Inc()
			o.Logger.Warn("admin: write refused", "action", action, "path", r.URL.Path, "peer", r.RemoteAddr, "why", how)
			refuse(w, how)
			return
		}
		if err := h(w, r); err != nil {
			o.writes.WithLabelValues(action, "error").Inc()
			o.Logger.Warn("admin: write failed", "action", action, "path", r.URL.Path, "peer", r.RemoteAddr, "auth", how, "err", err)
			return
		}
		o.writes.WithLabelValues(action, "ok").Inc()
		o.Logger.Info("admin: write", "action", action, "path", r.URL.Path, "query", r.URL.RawQuery, "peer", r.RemoteAddr, "auth", how)
	})
}

// authorise reports how r is authorised to write, or why not.
func (o *Ops) authorise(r *http.Request) (string, bool) { return authorise(r, o.Token, "writes") }

// authorise reports how r is authorised for what needs the admin token (what: "writes",
// "lookups by value"), or why not: the bearer token (the scheme's name in any case) when
// token is set, else a loopback peer.
func authorise(r *http.Request, token, what string) (string, bool) {
	if token != "" {
		got, ok := httphdr.CutBearer(r.Header.Get("Authorization"))
		if ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1 {
			return "token", true
		}
		return what + " need Authorization: Bearer <admin_token>", false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if a, perr := netip.ParseAddr(host); err == nil && perr == nil && a.Unmap().IsLoopback() {
		return "loopback", true
	}
	return "no admin_token is configured, so " + what + " are accepted from loopback peers only", false
}

// refuse writes the 401 of a request authorise refused, why being its reason.
func refuse(w http.ResponseWriter, why string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
	writeProblem(w, http.StatusUnauthorized, "Unauthorized", why)
}

// fail writes the problem for err and returns it.
func fail(w http.ResponseWriter, err error) error {
	switch {
	case errors.Is(err, queue.ErrUnknownQueue):
		writeProblem(w, http.StatusNotFound, "Unknown queue", strings.ReplaceAll(err.Error(), "\n", ": "))
	case errors.Is(err, queue.ErrNotFound):
		writeProblem(w, http.StatusNotFound, "Not found", err.Error())
	case errors.Is(err, queue.ErrConflict):
		writeProblem(w, http.StatusConflict, "Conflict", err.Error())
	case errors.Is(err, errBadRequest):
		writeProblem(w, http.StatusBadRequest, "Bad request", err.Error())
	default:
		writeProblem(w, http.StatusServiceUnavailable, "Queue state unavailable", err.Error())
	}
	return err
}

var errBadRequest = errors.New("bad request")

// badRequestError is a 400 whose message is what the client sent wrong.
type badRequestError struct{ msg string }

func (e *badRequestError) Error() string        { return e.msg }
func (e *badRequestError) Is(target error) bool { return target == errBadRequest }

func badRequest(format string, a ...any) error {
	return &badRequestError{fmt.Sprintf(format, a...)}
}

// queueOf returns the configured queue of the request's {queue}.
func (o *Ops) queueOf(r *http.Request) (*config.Queue, error) {
	name := r.PathValue("queue")
	q, ok := o.Queues.Config().Queue(name)
	if !ok {
		return nil, errors.Join(queue.ErrUnknownQueue, errors.New("no queue named "+strconv.Quote(name)))
	}
	return q, nil
}

// answerQueue writes the queue's state after a write.
func (o *Ops) answerQueue(w http.ResponseWriter, r *http.Request, cq *config.Queue) error {
	st, err := o.Queues.status(r.Context(), cq)
	if err != nil {
		return fail(w, err)
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (o *Ops) pause(w http.ResponseWriter, r *http.Request) error {
	cq, err := o.queueOf(r)
	if err != nil {
		return fail(w, err)
	}
	var until time.Time
	if s := r.URL.Query().Get("for"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return fail(w, badRequest("for: want a positive duration such as 30s or 5m, got %q", s))
		}
		until = time.Now().Add(d)
	}
	if _, err := o.Q.SetControl(r.Context(), cq.Name, func(c *queue.Control) {
		c.Paused, c.PausedUntil = true, until
	}); err != nil {
		return fail(w, err)
	}
	return o.answerQueue(w, r, cq)
}

func (o *Ops) resume(w http.ResponseWriter, r *http.Request) error {
	cq, err := o.queueOf(r)
	if err != nil {
		return fail(w, err)
	}
	if _, err := o.Q.SetControl(r.Context(), cq.Name, func(c *queue.Control) {
		c.Paused, c.PausedUntil = false, time.Time{}
	}); err != nil {
		return fail(w, err)
	}
	return o.answerQueue(w, r, cq)
}

func (o *Ops) rate(w http.ResponseWriter, r *http.Request) error {
	cq, err := o.queueOf(r)
	if err != nil {
		return fail(w, err)
	}
	var body struct {
		Rate *string `json:"rate"`
	}
	var raw map[string]json.RawMessage
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err := json.Unmarshal(data, &raw); err != nil {
		return fail(w, badRequest("want a JSON object such as {\"rate\":\"40/s\"}"))
	}
	if _, ok := raw["rate"]; !ok || len(raw) != 1 {
		return fail(w, badRequest("want exactly one field, rate: a rate such as \"40/s\", or null for the config file's"))
	}
	_ = json.Unmarshal(data, &body)
	rate := ""
	if body.Rate != nil {
		rt, err := config.ParseRate(*body.Rate)
		if err != nil {
			return fail(w, badRequest("rate: %v", err))
		}
		rate = rt.String()
	}
	if _, err := o.Q.SetControl(r.Context(), cq.Name, func(c *queue.Control) { c.Rate = rate }); err != nil {
		return fail(w, err)
	}
	return o.answerQueue(w, r, cq)
}

// deadLetterView is one dead letter as the API lists it.
type deadLetterView struct {
	ID         string    `json:"id"`
	Reason     string    `json:"reason"`
	Attempts   int       `json:"attempts"`
	LastStatus int       `json:"last_status"`
	Time       time.Time `json:"time"`
}

func (o *Ops) deadLetters(w http.ResponseWriter, r *http.Request) {
	cq, err := o.queueOf(r)
	if err != nil {
		fail(w, err)
		return
	}
	limit := 100
	if s := r.URL.Query().Get("limit"); s != "" {
		if n, err := strconv.Atoi(s); err == nil && n > 0 && n <= 10000 {
			limit = n
		}
	}
	dls, err := o.Q.DeadLetters(r.Context(), cq.Name, limit)
	if err != nil {
		fail(w, err)
		return
	}
	out := struct {
		DeadLetters []deadLetterView `json:"dead_letters"`
	}{DeadLetters: make([]deadLetterView, 0, len(dls))}
	for _, d := range dls {
		out.DeadLetters = append(out.DeadLetters, deadLetterView{ID: d.Job.ID, Reason: d.Reason,
			Attempts: d.Attempts, LastStatus: d.LastStatus, Time: d.FailedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// ids reads {"ids":[…]} from r's body; an empty body is nil (all).
func ids(r *http.Request) ([]string, error) {
	data, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, nil
	}
	var body struct {
		IDs []string `json:"ids"`
	}
	if err := json.Unmarshal(data, &body); err != nil || len(body.IDs) == 0 {
		return nil, badRequest("want {\"ids\":[…]} with at least one id, or no body for all")
	}
	return body.IDs, nil
}

func (o *Ops) replay(w http.ResponseWriter, r *http.Request) error {
	cq, err := o.queueOf(r)
	if err != nil {
		return fail(w, err)
	}
	want, err := ids(r)
	if err != nil {
		return fail(w, err)
	}
	if want == nil {
		dls, err := o.Q.DeadLetters(r.Context(), cq.Name, 10000)
		if err != nil {
			return fail(w, err)
		}
		for _, d := range dls {
			want = append(want, d.Job.ID)
		}
	}
	n := 0
	for _, id := range want {
		if err := o.Q.Replay(r.Context(), cq.Name, id); err != nil {
			if errors.Is(err, queue.ErrNotFound) && len(want) > 1 {
				continue
			}
			return fail(w, err)
		}
		n++
	}
	writeJSON(w, http.StatusOK, map[string]int{"replayed": n})
	return nil
}

func (o *Ops) purge(w http.ResponseWriter, r *http.Request) error {
	cq, err := o.queueOf(r)
	if err != nil {
		return fail(w, err)
	}
	want, err := ids(r)
	if err != nil {
		return fail(w, err)
	}
	n, err := o.Q.PurgeDeadLetters(r.Context(), cq.Name, want)
	if err != nil {
		return fail(w, err)
	}
	writeJSON(w, http.StatusOK, map[string]int{"purged": n})
	return nil
}

func (o *Ops) job(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	st, err := o.Q.Status(ctx, r.PathValue("id"))
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (o *Ops) cancel(w http.ResponseWriter, r *http.Request) error {
	st, err := o.Q.Cancel(r.Context(), r.PathValue("id"))
	if err != nil {
		return fail(w, err)
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}

// ruleView is one rule with its decision counts, for the dashboard.
type ruleView struct {
	Name      string             `json:"name"`
	Algorithm string             `json:"algorithm,omitempty"`
	Limit     int64              `json:"limit,omitempty"`
	Period    string             `json:"period,omitempty"`
	Action    string             `json:"action"`
	Queue     string             `json:"queue,omitempty"`
	Shadow    bool               `json:"shadow"`
	Decisions map[string]float64 `json:"decisions"` // by outcome
}

// rules serves GET /v1/rules: the config's rules with their decision counts so far.
func (o *Ops) rules(w http.ResponseWriter, r *http.Request) {
	counts := map[string]map[string]float64{}
	if o.Gatherer != nil {
		if mfs, err := o.Gatherer.Gather(); err == nil {
			for _, mf := range mfs {
				if mf.GetName() != "sluice_decisions_total" {
					continue
				}
				for _, m := range mf.GetMetric() {
					var rule, outcome string
					for _, l := range m.GetLabel() {
						switch l.GetName() {
						case "rule":
							rule = l.GetValue()
						case "outcome":
							outcome = l.GetValue()
						}
					}
					if counts[rule] == nil {
						counts[rule] = map[string]float64{}
					}
					counts[rule][outcome] += m.GetCounter().GetValue()
				}
			}
		}
	}
	cfg := o.Queues.Config()
	out := struct {
		Rules []ruleView `json:"rules"`
	}{Rules: make([]ruleView, 0, len(cfg.Rules))}
	for _, ru := range cfg.Rules {
		v := ruleView{Name: ru.Name, Algorithm: string(ru.Algorithm), Limit: ru.Limit, Action: string(ru.Action),
			Queue: ru.Queue, Shadow: ru.Shadow || cfg.Shadow, Decisions: counts[ru.Name]}
		if ru.Period > 0 {
			v.Period = ru.Period.String()
		}
		if v.Decisions == nil {
			v.Decisions = map[string]float64{}
		}
		out.Rules = append(out.Rules, v)
	}
	writeJSON(w, http.StatusOK, out)
}
