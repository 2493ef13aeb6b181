package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// top shows the queues, refreshed every --every, like top(1): sluice top [--every 2s]
// [--frames N]. Each frame reads GET /v1/queues and GET /v1/history?since=60 (the rates of
// the last minute, as the server sampled them) within --timeout; --frames 0 runs until
// interrupted. Frames after the first start with the terminal's clear-screen sequence.
func (c *cli) top(ctx context.Context, args []string, timeout time.Duration) error {
	fs := flag.NewFlagSet("top", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	every := fs.Duration("every", 2*time.Second, "time between frames")
	frames := fs.Int("frames", 0, "frames to draw, then exit (0: until interrupted)")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *every <= 0 || *frames < 0 {
		return usageErr("top [--every 2s] [--frames N]")
	}
	t := time.NewTicker(*every)
	defer t.Stop()
	for n := 0; *frames == 0 || n < *frames; n++ {
		if n > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
		}
		fctx, cancel := context.WithTimeout(ctx, timeout)
		frame, err := c.topFrame(fctx)
		cancel()
		if err != nil {
			return err
		}
		if n > 0 {
			fmt.Fprint(c.out, "\x1b[H\x1b[2J")
		}
		fmt.Fprint(c.out, frame)
	}
	return nil
}

// topFrame reads and renders one frame.
func (c *cli) topFrame(ctx context.Context) (string, error) {
	var qs struct {
		Queues []queueView `json:"queues"`
	}
	if _, err := c.api.call(ctx, "GET", "/v1/queues", nil, &qs); err != nil {
		return "", err
	}
	var hist struct {
		Queues []struct {
			Queue  string `json:"queue"`
			Points []struct {
				Delivered *float64 `json:"delivered"`
				Depth     uint64   `json:"depth"`
			} `json:"points"`
		} `json:"queues"`
	}
	_, herr := c.api.call(ctx, "GET", "/v1/history?since=60", nil, &hist)
	rates := map[string]string{}
	trend := map[string]string{}
	for _, h := range hist.Queues {
		var sum float64
		var n int
		var depths []uint64
		for _, p := range h.Points {
			if p.Delivered != nil {
				sum, n = sum+*p.Delivered, n+1
			}
			depths = append(depths, p.Depth)
		}
		if n > 0 {
			rates[h.Queue] = perSecond(sum / float64(n))
		}
		trend[h.Queue] = spark(depths)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "sluice top — %s — %s\n\n", c.api.base.Host, time.Now().Format("15:04:05"))
	tw := table(&b)
	fmt.Fprintln(tw, "QUEUE\tRATE\tALLOWED\tDELIVERED 1m\tDEPTH\tIN FLIGHT\tDEAD\tPAUSED\tDEPTH 1m")
	for _, q := range qs.Queues {
		allowed := "-"
		if q.EffectiveRate != nil {
			allowed = perSecond(*q.EffectiveRate)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\n", q.Name, rateText(q), allowed, orDash(rates[q.Name]),
			q.Depth, q.InFlight, q.DeadLetters, pausedText(q), trend[q.Name])
	}
	tw.Flush()
	if herr != nil {
		fmt.Fprintf(&b, "\n(history: %v)\n", herr)
	}
	return b.String(), nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// spark draws vs as a line of block characters, scaled to their maximum.
func spark(vs []uint64) string {
	const bars = "▁▂▃▄▅▆▇█"
	var top uint64
	for _, v := range vs {
		top = max(top, v)
	}
	var b strings.Builder
	for _, v := range vs {
		i := 0
		if top > 0 {
			i = int(math.Round(float64(v) / float64(top) * 7))
		}
		b.WriteString(string([]rune(bars)[i]))
	}
	return b.String()
}
