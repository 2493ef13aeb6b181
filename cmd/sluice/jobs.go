package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"time"
)

// browsedView is one job of GET /v1/queues/{q}/jobs.
type browsedView struct {
	ID        string                `json:"id"`
	State     string                `json:"state"`
	Attempts  int                   `json:"attempts"`
	Tenant    string                `json:"tenant"`
	CreatedAt time.Time             `json:"created_at"`
	LastError string                `json:"last_error"`
	Response  *struct{ Status int } `json:"response"`
}

// jobs lists a queue's jobs: sluice jobs Q [--state S] [--tenant T] [--limit N] [--cursor C]
// [--all]. Without --all it prints one page and, when there is more, the cursor of the next.
func (c *cli) jobs(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	state := fs.String("state", "", "queued, running, retrying, failed, dead, succeeded, canceled or all ('': every job in the queue)")
	tenant := fs.String("tenant", "", "a tenant id or value")
	limit := fs.Int("limit", 50, "jobs a page (1 to 1000)")
	cursor := fs.Uint64("cursor", 0, "the next cursor a page printed")
	all := fs.Bool("all", false, "follow the cursor to the end")
	var names []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return usageErr("jobs: %v", err)
		}
		if args = fs.Args(); len(args) > 0 {
			names, args = append(names, args[0]), args[1:]
		}
	}
	if err := exactly("jobs", names, "QUEUE"); err != nil {
		return err
	}
	next := *cursor
	for first := true; first || (*all && next != 0); first = false {
		q := url.Values{"limit": {strconv.Itoa(*limit)}, "cursor": {strconv.FormatUint(next, 10)}}
		if *state != "" {
			q.Set("state", *state)
		}
		if *tenant != "" {
			q.Set("tenant", *tenant)
		}
		var page struct {
			Jobs []browsedView `json:"jobs"`
			Next uint64        `json:"next"`
		}
		raw, err := c.api.call(ctx, "GET", "/v1/queues/"+url.PathEscape(names[0])+"/jobs?"+q.Encode(), nil, &page)
		if err != nil || c.json {
			if err := c.printRaw(raw, err); err != nil {
				return err
			}
		} else {
			printBrowsed(c.out, page.Jobs, first)
		}
		next = page.Next
	}
	if !*all && next != 0 && !c.json {
		fmt.Fprintf(c.out, "more: sluice jobs %s --cursor %d\n", names[0], next)
	}
	return nil
}

func printBrowsed(w io.Writer, jobs []browsedView, header bool) {
	tw := table(w)
	if header {
		fmt.Fprintln(tw, "ID\tSTATE\tATTEMPTS\tSTATUS\tTENANT\tCREATED\tLAST ERROR")
	}
	for _, j := range jobs {
		status := "-"
		if j.Response != nil {
			status = strconv.Itoa(j.Response.Status)
		}
		tenant := j.Tenant
		if tenant == "" {
			tenant = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", j.ID, j.State, j.Attempts, status, tenant, timeText(j.CreatedAt), j.LastError)
	}
	tw.Flush()
}
