package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

// QueueInfo describes queues; *queue.Queues implements it.
type QueueInfo interface {
	// Info describes queue name, or returns an error wrapping queue.ErrUnknownQueue.
	Info(ctx context.Context, name string) (queue.Info, error)
}

var _ QueueInfo = (*queue.Queues)(nil)

// Queues serves the queue endpoints of the admin API:
//
//	GET /v1/queues          {"queues": [QueueStatus, ...]}, in config order; a queue not yet
//	                        provisioned is listed empty
//	GET /v1/queues/{queue}  QueueStatus, or 404
//	GET /v1/queues/{queue}/tenants/{tenant}
//	                        TenantStatus of a fair queue's tenant, or 404
//
// Errors are application/problem+json. Fill in the fields and Mount it.
type Queues struct {
	// Info reads the state of a queue. Required.
	Info QueueInfo
	// Config returns the current config, whose queues are the ones listed. Required.
	Config func() *config.Config
	// PausedUntil returns until when a queue's deliveries are paused (after an upstream
	// 429 or 503), and false when it is not paused. Optional: nil reports no pause.
	PausedUntil func(ctx context.Context, queue string) (time.Time, bool, error)
	// Now is the clock that decides whether a pause is over. Nil: time.Now.
	Now func() time.Time
	// Controls returns the operators' controls of the queues (pause, runtime rate): read on
	// every queue read, so best the queue-wide ones alone (queue.Operator.QueueControls), whose
	// Tenants may be partial. Optional.
	Controls func(ctx context.Context) (map[string]queue.Control, error)
	// TenantControl reads the settings an operator set for one tenant (queue.Operator.
	// TenantControl). Optional: nil reads them from Controls.
	TenantControl func(ctx context.Context, queue, tenant string) (queue.TenantControl, bool, error)
	// TenantCounts counts each queue's tenants with settings of their own, for /v1/health
	// (queue.Operator.TenantCounts). Optional: nil counts Controls' Tenants.
	TenantCounts func(ctx context.Context) (map[string]int, error)
	// Learned returns the rate the workers learned for an adaptive queue, and false when they
	// keep none (it is at its ceiling). Optional.
	Learned func(ctx context.Context, queue string) (float64, bool, error)
	// Tenant describes one tenant of a fair queue (*queue.Queues.Tenant). Optional: nil
	// answers GET /v1/queues/{queue}/tenants/{tenant} with 404.
	Tenant func(ctx context.Context, queue, tenant string) (queue.TenantInfo, error)
	// Places reads the deliveries holding a concurrency place now: of the queue, and of tenant
	// when it is not "" (the worker's places, package inflight). Optional: nil shows none.
	Places func(ctx context.Context, queue, tenant string) (ofQueue, ofTenant int64, err error)
	// PausedTenants returns the tenants of a queue with pause_scope: tenant that its upstream
	// paused, with the time left of each. Optional: nil shows none.
	PausedTenants func(ctx context.Context, queue string) (map[string]time.Duration, error)
	// TenantID derives the tenant id of a tenant's value (*queue.IDs.TenantID, keyed with
	// the deployment's id secret), to find a tenant by its value (with the admin token) and
	// to label the tenants tenant_settings label. Optional: nil finds tenants by id only and
	// labels none.
	TenantID func(key []byte) (string, error)

	srv *Server // set by Mount: the admin token of lookups by value
}

// TenantStatus is the admin view of one tenant of a fair queue.
type TenantStatus struct {
	// Tenant is the tenant's id: its key parts' values keyed with the id secret
	// (queue.IDs.TenantID), as jobs carry it.
	Tenant string `json:"tenant"`
	// Label is the tenant's label (tenant_settings.<value>.label), else "". Its value, an
	// API key often, is never shown.
	Label string `json:"label,omitempty"`
	// Weight is its weight in the round robin.
	Weight float64 `json:"weight"`
	// Depth is how many of its jobs wait in its backlog.
	Depth uint64 `json:"depth"`
	// Delivered is how many of its jobs the scheduler has handed to the workers (only in
	// GET /v1/queues/{queue}/tenants/{tenant}, as the fields below).
	Delivered *uint64 `json:"delivered,omitempty"`
	// PausedUntil is when its upstream pause (pause_scope: tenant) ends; absent when none.
	PausedUntil *time.Time `json:"paused_until,omitempty"`
	// Delivering is how many of its deliveries hold a place of its in-flight cap now, and
	// MaxInFlight that cap (the queue's tenant_in_flight, or its own); absent without a cap.
	Delivering  *int64 `json:"delivering,omitempty"`
	MaxInFlight int64  `json:"max_in_flight,omitempty"`
	// Override is what an operator set for it alone (PATCH); absent when nothing.
	Override *queue.TenantControl `json:"override,omitempty"`
}

// QueueStatus is the admin view of one queue.
type QueueStatus struct {
	Name string `json:"name"`
	// Rate is the configured leak rate as the file writes it ("50/s"), and RatePerSecond
	// the same in deliveries per second.
	Rate          string  `json:"rate"`
	RatePerSecond float64 `json:"rate_per_second"`
	Burst         int64   `json:"burst"`
	// Depth is the number of jobs in the queue, waiting and in flight; MaxDepth its limit.
	Depth    uint64 `json:"depth"`
	MaxDepth int64  `json:"max_depth"`
	// Scheduled is the number of jobs waiting for their time (Sluice-Delay,
	// Sluice-Not-Before), not counted in Depth.
	Scheduled uint64 `json:"scheduled"`
	// Pending is the number of jobs no worker holds yet.
	Pending uint64 `json:"pending"`
	// InFlight is the number of jobs held by workers.
	InFlight int `json:"in_flight"`
	// Left is how many jobs have left the queue (delivered, dead-lettered or canceled) since
	// it was created; its rate of change is the drain rate.
	Left uint64 `json:"left"`
	// Consumers is the number of consumers of the queue's stream.
	Consumers int `json:"consumers"`
	// DeadLetters is the number of jobs in the dead-letter stream.
	DeadLetters uint64 `json:"dead_letters"`
	// Paused is whether deliveries are stopped now: by an operator, or until PausedUntil
	// after an upstream asked to back off.
	Paused bool `json:"paused"`
	// PausedUntil is when deliveries resume by themselves; null when the queue is not paused
	// or an operator paused it until resumed.
	PausedUntil *time.Time `json:"paused_until"`
	// RuntimeRate is the rate an operator set, which replaces Rate; null for none.
	RuntimeRate *string `json:"runtime_rate"`
	// EffectiveRate is how many deliveries per second the queue is allowed now: 0 while
	// paused, else the runtime rate or the file's.
	EffectiveRate float64 `json:"effective_rate"`
	// MaxInFlight is the queue's max_in_flight, and Delivering how many deliveries hold one of
	// its places now; absent without the cap.
	MaxInFlight int64  `json:"max_in_flight,omitempty"`
	Delivering  *int64 `json:"delivering,omitempty"`
	// CostRate is the queue's unit budget as the file writes it ("20000/m"), CostPerSecond
	// the same in units per second, and CostBurst its burst; absent without cost_rate.
	CostRate      string  `json:"cost_rate,omitempty"`
	CostPerSecond float64 `json:"cost_per_second,omitempty"`
	CostBurst     int64   `json:"cost_burst,omitempty"`
	// PausedTenants is how many tenants its upstream has paused now (pause_scope: tenant).
	PausedTenants *int `json:"paused_tenants,omitempty"`
	// Fair is whether the queue shares its rate among its tenants; the fields below are
	// there only then. Backlog is how many of Depth wait in the tenants' backlogs, Tenants
	// how many tenants have jobs waiting there, TopTenants the deepest of them.
	Fair       bool           `json:"fair,omitempty"`
	Backlog    uint64         `json:"backlog,omitempty"`
	Tenants    int            `json:"tenants,omitempty"`
	TopTenants []TenantStatus `json:"top_tenants,omitempty"`
}

// Mount mounts the queue endpoints on s, and has s answer the Host names of the current
// config's admin_hosts (Server.AllowHosts).
func (q *Queues) Mount(s *Server) {
	q.srv = s
	s.AllowHosts(func() []string { return q.Config().AdminHosts })
	s.Handle("GET /v1/queues", http.HandlerFunc(q.list))
	s.Handle("GET /v1/queues/{queue}", http.HandlerFunc(q.one))
	s.Handle("GET /v1/queues/{queue}/tenants/{tenant}", http.HandlerFunc(q.tenant))
}

// tenant serves GET /v1/queues/{queue}/tenants/{tenant}: {tenant} is a tenant id (32 hex
// digits, as TopTenants lists them) or, with the admin token, a tenant's value, whose id
// TenantID derives (without it, anyone could confirm who is a customer).
func (q *Queues) tenant(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	cq, ok := q.Config().Queue(name)
	if !ok || !cq.Fair || q.Tenant == nil {
		writeProblem(w, http.StatusNotFound, "Unknown queue", "no fair queue named "+strconv.Quote(name))
		return
	}
	id, ok := q.tenantIDOf(w, r, r.PathValue("tenant"))
	if !ok {
		return
	}
	ti, err := q.Tenant(r.Context(), name, id)
	switch {
	case errors.Is(err, queue.ErrUnknownQueue):
		writeProblem(w, http.StatusNotFound, "Unknown queue", "queue "+strconv.Quote(name)+" is configured but not provisioned as fair")
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, "Tenant state unavailable", err.Error())
	default:
		st := tenantStatus(q.fileTenants(cq), id, ti.Depth)
		st.Delivered = &ti.Delivered
		q.setScheduling(r.Context(), &st, cq, id)
		writeJSON(w, http.StatusOK, st)
	}
}

// tenantIDOf returns the tenant id that t names: t itself when it is an id, else the id of
// the value t, which needs the admin token. It answers the request itself and returns false
// when it cannot.
func (q *Queues) tenantIDOf(w http.ResponseWriter, r *http.Request, t string) (string, bool) {
	if isTenantID(t) {
		return t, true
	}
	if q.TenantID == nil {
		writeProblem(w, http.StatusNotFound, "Unknown tenant", "tenants are found by id (32 hex digits) here")
		return "", false
	}
	if q.srv != nil {
		if why, ok := q.srv.authorise(r, "lookups of tenants by value"); !ok {
			refuse(w, why+"; find a tenant by its id (32 hex digits) without it")
			return "", false
		}
	}
	id, err := q.TenantID([]byte(t))
	if err != nil {
		writeProblem(w, http.StatusServiceUnavailable, "Tenant state unavailable", err.Error())
		return "", false
	}
	return id, true
}

// isTenantID reports whether s has the form of a tenant id: 32 lower-case hex digits.
func isTenantID(s string) bool {
	if len(s) != 32 {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// fileTenant is what the config file says of one tenant: its label and weight.
type fileTenant struct {
	label  string
	weight float64
}

// tenantStatus is tenant id of cq with depth, labelled and weighted as the file says.
func tenantStatus(named map[string]fileTenant, id string, depth uint64) TenantStatus {
	st := TenantStatus{Tenant: id, Weight: 1, Depth: depth}
	if ft, ok := named[id]; ok {
		st.Label, st.Weight = ft.label, ft.weight
	}
	return st
}

// fileTenants maps the ids of the tenants cq's weights and tenant_settings name to their
// labels and weights (tenant_settings' weight over weights'); empty when ids cannot be
// derived (no TenantID, or the queues are not open yet). The values themselves stay here.
func (q *Queues) fileTenants(cq *config.Queue) map[string]fileTenant {
	named := make(map[string]fileTenant, len(cq.Weights)+len(cq.TenantSettings))
	if q.TenantID == nil {
		return named
	}
	add := func(v string, set func(*fileTenant)) bool {
		id, err := q.TenantID([]byte(v))
		if err != nil {
			return false
		}
		ft, ok := named[id]
		if !ok {
			ft.weight = 1
		}
		set(&ft)
		named[id] = ft
		return true
	}
	for v, w := range cq.Weights {
		if !add(v, func(ft *fileTenant) { ft.weight = w }) {
			return map[string]fileTenant{}
		}
	}
	for v, ts := range cq.TenantSettings {
		if !add(v, func(ft *fileTenant) {
			ft.label = ts.Label
			if ts.Weight > 0 {
				ft.weight = ts.Weight
			}
		}) {
			return map[string]fileTenant{}
		}
	}
	return named
}

func (q *Queues) list(w http.ResponseWriter, r *http.Request) {
	cfg := q.Config()
	out := struct {
		Queues []QueueStatus `json:"queues"`
	}{Queues: make([]QueueStatus, 0, len(cfg.Queues))}
	for i := range cfg.Queues {
		st, err := q.status(r.Context(), &cfg.Queues[i])
		if errors.Is(err, queue.ErrUnknownQueue) {
			err = nil // configured, not provisioned yet (a reload in progress): empty
		}
		if err != nil {
			writeProblem(w, http.StatusServiceUnavailable, "Queue state unavailable", err.Error())
			return
		}
		out.Queues = append(out.Queues, st)
	}
	writeJSON(w, http.StatusOK, out)
}

func (q *Queues) one(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("queue")
	cq, ok := q.Config().Queue(name)
	if !ok {
		writeProblem(w, http.StatusNotFound, "Unknown queue", "no queue named "+strconv.Quote(name))
		return
	}
	st, err := q.status(r.Context(), cq)
	switch {
	case errors.Is(err, queue.ErrUnknownQueue):
		writeProblem(w, http.StatusNotFound, "Unknown queue", "queue "+strconv.Quote(name)+" is configured but not provisioned")
	case err != nil:
		writeProblem(w, http.StatusServiceUnavailable, "Queue state unavailable", err.Error())
	default:
		writeJSON(w, http.StatusOK, st)
	}
}

// status reads the state of configured queue cq: its stream's, its pauses (upstream and
// operator), its runtime and learned rates.
func (q *Queues) status(ctx context.Context, cq *config.Queue) (QueueStatus, error) {
	st := QueueStatus{
		Name:          cq.Name,
		Rate:          cq.Rate.String(),
		RatePerSecond: cq.Rate.PerSecond(),
		Burst:         cq.Burst,
		MaxDepth:      cq.MaxDepth,
	}
	if cq.CostRate.N > 0 {
		st.CostRate, st.CostPerSecond, st.CostBurst = cq.CostRate.String(), cq.CostRate.PerSecond(), cq.CostBurst
	}
	info, err := q.Info.Info(ctx, cq.Name)
	if err != nil {
		return st, err
	}
	st.setInfo(info, cq, q.fileTenants)
	now := time.Now
	if q.Now != nil {
		now = q.Now
	}
	if err := q.setPausedUntil(ctx, &st, now()); err != nil {
		return st, err
	}
	st.EffectiveRate = st.RatePerSecond
	if err := q.setControl(ctx, &st, now()); err != nil {
		return st, err
	}
	if cq.Adaptive && q.Learned != nil {
		if eff, ok, err := q.Learned(ctx, cq.Name); err == nil && ok && eff < st.EffectiveRate {
			st.EffectiveRate = eff
		}
	}
	if st.Paused {
		st.EffectiveRate = 0
	}
	if cq.MaxInFlight > 0 && q.Places != nil {
		st.MaxInFlight = cq.MaxInFlight
		if n, _, err := q.Places(ctx, cq.Name, ""); err == nil {
			st.Delivering = &n
		}
	}
	if cq.PauseScope == config.PauseTenant && q.PausedTenants != nil {
		if paused, err := q.PausedTenants(ctx, cq.Name); err == nil {
			n := len(paused)
			st.PausedTenants = &n
		}
	}
	return st, nil
}

// setScheduling sets what the tenant view shows of tenant id's pause, places and settings.
func (q *Queues) setScheduling(ctx context.Context, st *TenantStatus, cq *config.Queue, id string) {
	var o queue.TenantControl
	ok := false
	switch {
	case q.TenantControl != nil:
		o, ok, _ = q.TenantControl(ctx, cq.Name, id)
	case q.Controls != nil:
		if cs, err := q.Controls(ctx); err == nil {
			o, ok = cs[cq.Name].Tenants[id]
		}
	}
	if ok {
		st.Override = &o
		if o.Weight > 0 {
			st.Weight = o.Weight
		}
	}
	if cq.PauseScope == config.PauseTenant && q.PausedTenants != nil {
		if paused, err := q.PausedTenants(ctx, cq.Name); err == nil {
			if d, ok := paused[id]; ok {
				until := q.now().Add(d).UTC()
				st.PausedUntil = &until
			}
		}
	}
	st.MaxInFlight = cq.TenantInFlight
	if ts, ok := q.fileSettings(cq, id); ok {
		if ts.InFlight > 0 {
			st.MaxInFlight = ts.InFlight
		}
		if ts.Weight > 0 && (st.Override == nil || st.Override.Weight == 0) {
			st.Weight = ts.Weight
		}
	}
	if st.Override != nil && st.Override.InFlight > 0 {
		st.MaxInFlight = st.Override.InFlight
	}
	if st.MaxInFlight > 0 && q.Places != nil {
		if _, n, err := q.Places(ctx, cq.Name, id); err == nil {
			st.Delivering = &n
		}
	}
}

// fileSettings returns the config file's tenant_settings of tenant id of cq, if any.
func (q *Queues) fileSettings(cq *config.Queue, id string) (config.TenantSettings, bool) {
	if q.TenantID == nil {
		return config.TenantSettings{}, false
	}
	for v, ts := range cq.TenantSettings {
		if tid, err := q.TenantID([]byte(v)); err == nil && tid == id {
			return ts, true
		}
	}
	return config.TenantSettings{}, false
}

func (q *Queues) now() time.Time {
	if q.Now != nil {
		return q.Now()
	}
	return time.Now()
}

// setInfo sets what info says of configured queue cq: its counts and, when it is fair, its
// tenants.
func (st *QueueStatus) setInfo(info queue.Info, cq *config.Queue, fileTenants func(*config.Queue) map[string]fileTenant) {
	st.Depth, st.Pending, st.InFlight, st.Scheduled = info.Depth, info.Pending, info.InFlight, info.Scheduled
	st.Consumers, st.DeadLetters, st.Left = info.Consumers, info.DeadLetters, info.Left
	if !info.Fair {
		return
	}
	st.Fair, st.Backlog, st.Tenants = true, info.Backlog, info.Tenants
	st.TopTenants = make([]TenantStatus, 0, len(info.TopTenants))
	named := fileTenants(cq)
	for _, td := range info.TopTenants {
		st.TopTenants = append(st.TopTenants, tenantStatus(named, td.Tenant, td.Depth))
	}
}

// setPausedUntil sets the pause an upstream asked for, if it lasts beyond now.
func (q *Queues) setPausedUntil(ctx context.Context, st *QueueStatus, now time.Time) error {
	if q.PausedUntil == nil {
		return nil
	}
	until, paused, err := q.PausedUntil(ctx, st.Name)
	if err != nil {
		return err
	}
	if paused && until.After(now) {
		u := until.UTC()
		st.Paused, st.PausedUntil = true, &u
	}
	return nil
}

// setControl sets the operators' controls of the queue: a runtime rate replaces the
// effective rate, and an operator's pause in force at now replaces an upstream's.
func (q *Queues) setControl(ctx context.Context, st *QueueStatus, now time.Time) error {
	if q.Controls == nil {
		return nil
	}
	cs, err := q.Controls(ctx)
	if err != nil {
		return err
	}
	c := cs[st.Name]
	if c.Rate != "" {
		rate := c.Rate
		st.RuntimeRate = &rate
		if rt, err := config.ParseRate(c.Rate); err == nil {
			st.EffectiveRate = rt.PerSecond()
		}
	}
	if c.PausedAt(now) {
		st.Paused, st.PausedUntil = true, nil
		if !c.PausedUntil.IsZero() {
			u := c.PausedUntil.UTC()
			st.PausedUntil = &u
		}
	}
	return nil
}

// writeProblem writes an RFC 9457 problem.
func writeProblem(w http.ResponseWriter, code int, title, detail string) {
	detail = plainDetail(detail)
	body, _ := json.Marshal(map[string]any{"type": "about:blank", "title": title, "status": code, "detail": detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	w.Write(body)
}

// packagePrefix is the "pkg: " or "pkg: sentinel: " that Sluice's packages put before their
// errors; an operator reading a problem needs the reason, not the package it came from.
var packagePrefix = regexp.MustCompile(`^(?:(?:queue|leaky|inflight|limit|worker|admin|fair)(?:: (?:conflict|job not found))?: )+`)

// plainDetail is detail without leading package prefixes and with go-redis's doubled "redis: ".
func plainDetail(detail string) string {
	detail = packagePrefix.ReplaceAllString(detail, "")
	for strings.Contains(detail, "redis: redis: ") {
		detail = strings.ReplaceAll(detail, "redis: redis: ", "redis: ")
	}
	return detail
}

// Metrics returns a collector of the queues' state, for alerting: sluice_queue_depth,
// sluice_queue_in_flight, sluice_queue_dead_letters, sluice_queue_paused (0/1),
// sluice_queue_effective_rate (deliveries/s allowed now) and, for fair queues,
// sluice_queue_tenants (tenants with jobs waiting), all by queue. A scrape reads
// JetStream once per queue at most once a second; scrapes in between get the cached values.
func (q *Queues) Metrics() prometheus.Collector { return &queueMetrics{q: q} }

type queueMetrics struct {
	q *Queues

	mu   sync.Mutex
	at   time.Time
	last []QueueStatus
}

var (
	descDepth         = prometheus.NewDesc("sluice_queue_depth", "Jobs in the queue, waiting and in flight.", []string{"queue"}, nil)
	descInFlight      = prometheus.NewDesc("sluice_queue_in_flight", "Jobs held by workers.", []string{"queue"}, nil)
	descScheduled     = prometheus.NewDesc("sluice_queue_scheduled", "Jobs waiting for their time (Sluice-Delay, Sluice-Not-Before), not in sluice_queue_depth.", []string{"queue"}, nil)
	descDead          = prometheus.NewDesc("sluice_queue_dead_letters", "Jobs in the queue's dead-letter stream.", []string{"queue"}, nil)
	descPaused        = prometheus.NewDesc("sluice_queue_paused", "1 while the queue's deliveries are paused (by an operator or an upstream's Retry-After).", []string{"queue"}, nil)
	descEffective     = prometheus.NewDesc("sluice_queue_effective_rate", "Deliveries per second the queue is allowed now.", []string{"queue"}, nil)
	descTenants       = prometheus.NewDesc("sluice_queue_tenants", "Tenants with jobs waiting in a fair queue's backlogs.", []string{"queue"}, nil)
	descDelivering    = prometheus.NewDesc("sluice_queue_delivering", "Deliveries holding a place of the queue's max_in_flight now.", []string{"queue"}, nil)
	descMaxInFlight   = prometheus.NewDesc("sluice_queue_max_in_flight", "The queue's max_in_flight.", []string{"queue"}, nil)
	descPausedTenants = prometheus.NewDesc("sluice_queue_paused_tenants", "Tenants of a queue with pause_scope: tenant that its upstream paused now.", []string{"queue"}, nil)
)

func (m *queueMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDepth, descInFlight, descScheduled, descDead, descPaused, descEffective, descTenants,
		descDelivering, descMaxInFlight, descPausedTenants} {
		ch <- d
	}
}

func (m *queueMetrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	if time.Since(m.at) >= time.Second {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		cfg := m.q.Config()
		out := make([]QueueStatus, 0, len(cfg.Queues))
		for i := range cfg.Queues {
			if st, err := m.q.status(ctx, &cfg.Queues[i]); err == nil {
				out = append(out, st)
			}
		}
		cancel()
		m.last, m.at = out, time.Now()
	}
	sts := m.last
	m.mu.Unlock()
	for _, st := range sts {
		paused := 0.0
		if st.Paused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(st.Depth), st.Name)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.InFlight), st.Name)
		ch <- prometheus.MustNewConstMetric(descScheduled, prometheus.GaugeValue, float64(st.Scheduled), st.Name)
		ch <- prometheus.MustNewConstMetric(descDead, prometheus.GaugeValue, float64(st.DeadLetters), st.Name)
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, paused, st.Name)
		ch <- prometheus.MustNewConstMetric(descEffective, prometheus.GaugeValue, st.EffectiveRate, st.Name)
		if st.Fair {
			ch <- prometheus.MustNewConstMetric(descTenants, prometheus.GaugeValue, float64(st.Tenants), st.Name)
		}
		if st.Delivering != nil {
			ch <- prometheus.MustNewConstMetric(descDelivering, prometheus.GaugeValue, float64(*st.Delivering), st.Name)
			ch <- prometheus.MustNewConstMetric(descMaxInFlight, prometheus.GaugeValue, float64(st.MaxInFlight), st.Name)
		}
		if st.PausedTenants != nil {
			ch <- prometheus.MustNewConstMetric(descPausedTenants, prometheus.GaugeValue, float64(*st.PausedTenants), st.Name)
		}
	}
}
