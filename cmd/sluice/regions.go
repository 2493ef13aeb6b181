package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// regionsView is GET /v1/regions: each global queue's regional leases on the coordinator.
type regionsView struct {
	Region       string             `json:"region"`
	Regions      []string           `json:"regions"`
	Coordinator  string             `json:"coordinator"`
	LeaseSeconds float64            `json:"lease_seconds"`
	RenewSeconds float64            `json:"renew_seconds"`
	Queues       []globalBudgetView `json:"queues"`
	Rules        []globalBudgetView `json:"rules"`
}

// globalBudgetView is one global queue's or rule's budget and leases.
type globalBudgetView struct {
	Queue     string     `json:"queue"`
	Rule      string     `json:"rule"`
	Budget    float64    `json:"budget"`
	Held      float64    `json:"held"`
	SafeShare float64    `json:"safe_share"`
	HoldUntil *time.Time `json:"hold_until"`
	Leases    []struct {
		Region      string     `json:"region"`
		Share       float64    `json:"share"`
		Expires     *time.Time `json:"expires"`
		Held        float64    `json:"held"`
		Demand      float64    `json:"demand"`
		Renewed     *time.Time `json:"renewed"`
		OnSafeShare bool       `json:"on_safe_share"`
		Lost        bool       `json:"lost"`
	} `json:"leases"`
}

// regions prints each global queue's and rule's regional leases: `sluice regions`.
func (c *cli) regions(ctx context.Context, args []string) error {
	if err := exactly("regions", args); err != nil {
		return err
	}
	var v regionsView
	raw, err := c.api.call(ctx, "GET", "/v1/regions", nil, &v)
	if err != nil || c.json {
		return c.printRaw(raw, err)
	}
	return printRegions(c.out, v, time.Now())
}

// printRegions prints v as of now: a line on the deployment's region and coordinator, then
// one row per region and global queue.
func printRegions(w io.Writer, v regionsView, now time.Time) error {
	if v.Region == "" {
		_, err := fmt.Fprintln(w, "no regions: this deployment shares no budget (set region and regions, and global: true on a queue)")
		return err
	}
	fmt.Fprintf(w, "region %s of %s; coordinator %s; lease %gs, renewed every %gs\n", v.Region, strings.Join(v.Regions, ", "),
		v.Coordinator, v.LeaseSeconds, v.RenewSeconds)
	t := table(w)
	fmt.Fprintln(t, "SHARED\tBUDGET\tREGION\tSHARE\tEXPIRES IN\tDEMAND\tRENEWED\tSTATE")
	for _, q := range append(v.Queues, v.Rules...) {
		name := "queue " + q.Queue
		if q.Rule != "" {
			name = "rule " + q.Rule // its budget is its limit per key, per second
		}
		if len(q.Leases) == 0 {
			fmt.Fprintf(t, "%s\t%s\t-\t-\t-\t-\t-\tunknown (coordinator unreadable)\n", name, perSecond(q.Budget))
		}
		for _, l := range q.Leases {
			expires, renewed := "-", "-"
			if l.Expires != nil && l.Expires.After(now) {
				expires = l.Expires.Sub(now).Round(100 * time.Millisecond).String()
			}
			if l.Renewed != nil {
				renewed = now.Sub(*l.Renewed).Round(100*time.Millisecond).String() + " ago"
			}
			state := "on its lease"
			switch {
			case l.Renewed == nil:
				state = "never renewed: safe share " + perSecond(q.SafeShare)
			case l.Lost:
				state = "LOST: safe share " + perSecond(q.SafeShare) + " for longer than a lease"
			case l.OnSafeShare:
				state = "safe share " + perSecond(q.SafeShare)
			}
			if q.HoldUntil != nil {
				state += fmt.Sprintf(" (coordinator holds for %s)", q.HoldUntil.Sub(now).Round(100*time.Millisecond))
			}
			fmt.Fprintf(t, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, perSecond(q.Budget), l.Region, perSecond(l.Share), expires,
				perSecond(l.Demand), renewed, state)
		}
	}
	return t.Flush()
}
