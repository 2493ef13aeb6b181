package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// queueView is what the CLI shows of a queue (GET /v1/queues/{q}).
type queueView struct {
	Name          string       `json:"name"`
	Rate          string       `json:"rate"`
	RatePerSecond float64      `json:"rate_per_second"`
	EffectiveRate *float64     `json:"effective_rate"`
	RuntimeRate   *string      `json:"runtime_rate"`
	Depth         uint64       `json:"depth"`
	Pending       uint64       `json:"pending"`
	InFlight      int          `json:"in_flight"`
	Scheduled     uint64       `json:"scheduled"`
	DeadLetters   uint64       `json:"dead_letters"`
	Paused        bool         `json:"paused"`
	PausedUntil   *time.Time   `json:"paused_until"`
	Fair          bool         `json:"fair"`
	Tenants       int          `json:"tenants"`
	MaxInFlight   int64        `json:"max_in_flight"`
	Delivering    *int64       `json:"delivering"`
	PausedTenants *int         `json:"paused_tenants"`
	TopTenants    []tenantView `json:"top_tenants"`
}

// tenantView is one tenant of a fair queue (GET /v1/queues/{q}/tenants/{t}, or a queue's
// top_tenants).
type tenantView struct {
	Tenant    string  `json:"tenant"`
	Label     string  `json:"label"`
	Weight    float64 `json:"weight"`
	Depth     uint64  `json:"depth"`
	Delivered *uint64 `json:"delivered"`
	// PausedUntil, Delivering, MaxInFlight and Override: see the admin API's TenantStatus.
	PausedUntil *time.Time `json:"paused_until"`
	Delivering  *int64     `json:"delivering"`
	MaxInFlight int64      `json:"max_in_flight"`
	Override    *struct {
		Weight   float64 `json:"weight"`
		Rate     string  `json:"rate"`
		InFlight int64   `json:"in_flight"`
	} `json:"override"`
}

// deadLetterView is one dead letter (GET /v1/queues/{q}/dead-letters).
type deadLetterView struct {
	ID         string    `json:"id"`
	Reason     string    `json:"reason"`
	Attempts   int       `json:"attempts"`
	LastStatus int       `json:"last_status"`
	Time       time.Time `json:"time"`
	Error      string    `json:"error"`
}

// jobView is a job's state (GET /v1/jobs/{id}).
type jobView struct {
	ID        string    `json:"id"`
	Queue     string    `json:"queue"`
	State     string    `json:"state"`
	Attempts  int       `json:"attempts"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	LastError string    `json:"last_error"`
	Response  *struct {
		Status int `json:"status"`
	} `json:"response"`
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func printQueues(w io.Writer, qs []queueView) error {
	t := table(w)
	fmt.Fprintln(t, "QUEUE\tRATE\tEFFECTIVE\tDEPTH\tSCHEDULED\tPENDING\tIN FLIGHT\tDELIVERING\tDEAD\tPAUSED\tTENANTS")
	for _, q := range qs {
		rate := rateText(q)
		eff := "-"
		if q.EffectiveRate != nil {
			eff = perSecond(*q.EffectiveRate)
		}
		tenants := "-" // not fair
		if q.Fair {
			tenants = strconv.Itoa(q.Tenants)
			if q.PausedTenants != nil {
				tenants += fmt.Sprintf(" (%d paused)", *q.PausedTenants)
			}
		}
		delivering := "-" // no max_in_flight
		if q.Delivering != nil {
			delivering = fmt.Sprintf("%d/%d", *q.Delivering, q.MaxInFlight)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%s\t%s\n", q.Name, rate, eff, q.Depth, q.Scheduled, q.Pending,
			q.InFlight, delivering, q.DeadLetters, pausedText(q), tenants)
	}
	return t.Flush()
}

// printTenants prints tenants of a fair queue, with their delivered counts when known.
func printTenants(w io.Writer, ts []tenantView) error {
	t := table(w)
	fmt.Fprintln(t, "TENANT\tLABEL\tWEIGHT\tWAITING\tDELIVERED\tDELIVERING\tPAUSED\tOVERRIDE")
	for _, tv := range ts {
		name, delivered, delivering, paused, override := tv.Label, "-", "-", "no", "-"
		if name == "" {
			name = "-"
		}
		if tv.Delivered != nil {
			delivered = strconv.FormatUint(*tv.Delivered, 10)
		}
		if tv.Delivering != nil {
			delivering = fmt.Sprintf("%d/%d", *tv.Delivering, tv.MaxInFlight)
		}
		if tv.PausedUntil != nil {
			paused = "until " + tv.PausedUntil.Local().Format(time.DateTime)
		}
		if o := tv.Override; o != nil {
			override = fmt.Sprintf("weight=%s rate=%s in_flight=%d", strconv.FormatFloat(o.Weight, 'f', -1, 64), o.Rate, o.InFlight)
		}
		fmt.Fprintf(t, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", tv.Tenant, name, strconv.FormatFloat(tv.Weight, 'f', -1, 64), tv.Depth,
			delivered, delivering, paused, override)
	}
	return t.Flush()
}

// perSecond writes a rate for people: three significant digits at most, whole numbers from
// 100/s ("8.33/s", "41.7/s", "2000/s").
func perSecond(r float64) string {
	var s string
	switch {
	case r >= 100:
		s = strconv.FormatFloat(r, 'f', 0, 64)
	case r >= 10:
		s = strconv.FormatFloat(r, 'f', 1, 64)
	default:
		s = strconv.FormatFloat(r, 'f', 2, 64)
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s + "/s"
}

// rateText is the queue's rate now: the runtime rate an operator set, marked, or the file's.
func rateText(q queueView) string {
	if q.RuntimeRate != nil {
		return *q.RuntimeRate + " (runtime)"
	}
	return q.Rate
}

func pausedText(q queueView) string {
	switch {
	case q.PausedUntil != nil:
		return "until " + q.PausedUntil.Local().Format(time.DateTime)
	case q.Paused:
		return "yes"
	}
	return "no"
}

func printDeadLetters(w io.Writer, dls []deadLetterView) error {
	if len(dls) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters")
		return err
	}
	t := table(w)
	fmt.Fprintln(t, "ID\tREASON\tATTEMPTS\tLAST STATUS\tTIME\tERROR")
	for _, d := range dls {
		status := "-"
		if d.LastStatus != 0 {
			status = strconv.Itoa(d.LastStatus)
		}
		fmt.Fprintf(t, "%s\t%s\t%d\t%s\t%s\t%s\n", d.ID, d.Reason, d.Attempts, status,
			timeText(d.Time), d.Error)
	}
	return t.Flush()
}

func printJob(w io.Writer, j jobView) error {
	t := table(w)
	status := "-"
	if j.Response != nil && j.Response.Status != 0 {
		status = strconv.Itoa(j.Response.Status)
	}
	for _, row := range [][2]string{
		{"id", j.ID}, {"queue", j.Queue}, {"state", j.State}, {"attempts", strconv.Itoa(j.Attempts)},
		{"created", timeText(j.CreatedAt)}, {"updated", timeText(j.UpdatedAt)},
		{"response", status}, {"last error", j.LastError},
	} {
		fmt.Fprintf(t, "%s\t%s\n", row[0], row[1])
	}
	return t.Flush()
}

func timeText(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.DateTime)
}
