// Command load is Sluice's load tool: a closed-loop HTTP load generator with a fixed number of
// connections, bounded in time and in requests, that reports throughput, latency percentiles and
// the count of every status code. It only targets loopback addresses.
//
// It exists beside wrk (which the benchmark script uses for the GET paths) because the defer
// path's figures need what wrk does not give: the count of each status code (202 against 429,
// 503 and 413 — wrk reports only "non-2xx"), a request-count bound as well as a time bound, and
// a refusal to send anything off the machine.
//
//	go run ./cmd/load -url http://127.0.0.1:8080/api/orders -method POST -body '{"n":1}' \
//	    -header 'X-API-Key: k1' -c 64 -d 10s
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

type headers []string

func (h *headers) String() string     { return strings.Join(*h, ", ") }
func (h *headers) Set(v string) error { *h = append(*h, v); return nil }

// options are the command line's.
type options struct {
	target, method, body string
	hdrs                 []string
	uniqKey              string
	conns                int
	dur, warmup          time.Duration
	maxReqs              int
	jsonOut              bool
}

func main() {
	var o options
	var hdrs headers
	flag.StringVar(&o.target, "url", "", "URL to load (loopback only)")
	flag.StringVar(&o.method, "method", "GET", "HTTP method")
	flag.StringVar(&o.body, "body", "", "request body")
	flag.IntVar(&o.conns, "c", 64, "concurrent connections")
	flag.DurationVar(&o.dur, "d", 10*time.Second, "duration")
	flag.IntVar(&o.maxReqs, "n", 0, "stop after this many requests (0 = duration only)")
	flag.StringVar(&o.uniqKey, "unique-header", "", "header set to a unique value per request (e.g. X-API-Key)")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "run this long before measuring")
	flag.BoolVar(&o.jsonOut, "json", false, "print one JSON line instead of the report")
	flag.Var(&hdrs, "header", "request header 'Name: value' (repeatable)")
	flag.Parse()
	o.hdrs = hdrs
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
}

// result is what one connection saw while measuring.
type result struct {
	lat    []time.Duration
	status map[int]int
	errs   int
}

// run loads o.target with o.conns connections, then prints the report.
func run(o options) error {
	h, err := o.check()
	if err != nil {
		return err
	}
	tr := &http.Transport{MaxIdleConnsPerHost: o.conns, MaxConnsPerHost: o.conns, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), o.warmup+o.dur)
	defer cancel()
	start := time.Now()
	measureFrom := start.Add(o.warmup)
	l := &loader{o: o, client: client, h: h, measureFrom: measureFrom}
	results := make([]result, o.conns)
	var sent sync.WaitGroup
	for i := range o.conns {
		sent.Add(1)
		go func() {
			defer sent.Done()
			results[i] = l.connection(ctx, i)
		}()
	}
	sent.Wait()
	elapsed := time.Since(measureFrom)
	if o.maxReqs > 0 {
		elapsed = time.Since(start)
	}
	return o.report(results, elapsed)
}

// check refuses a target off the machine and returns the request headers.
func (o options) check() (http.Header, error) {
	u, err := url.Parse(o.target)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("-url %q: want an absolute URL", o.target)
	}
	if ip := net.ParseIP(u.Hostname()); !(u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback())) {
		return nil, fmt.Errorf("-url %q: only loopback targets are allowed", o.target)
	}
	h := http.Header{}
	for _, kv := range o.hdrs {
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return nil, fmt.Errorf("-header %q: want 'Name: value'", kv)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return h, nil
}

// loader sends the requests of every connection.
type loader struct {
	o           options
	client      *http.Client
	h           http.Header
	measureFrom time.Time

	mu   sync.Mutex
	sent int // requests started, when bounded by -n
}

// next reports whether another request may start under -n.
func (l *loader) next() bool {
	if l.o.maxReqs <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sent >= l.o.maxReqs {
		return false
	}
	l.sent++
	return true
}

// connection sends requests one after another until ctx ends or -n is reached.
func (l *loader) connection(ctx context.Context, i int) result {
	r := result{status: map[int]int{}}
	for seq := 0; ctx.Err() == nil && l.next(); seq++ {
		req, _ := http.NewRequestWithContext(ctx, l.o.method, l.o.target, bytes.NewReader([]byte(l.o.body)))
		req.Header = l.h.Clone()
		if l.o.uniqKey != "" {
			req.Header.Set(l.o.uniqKey, fmt.Sprintf("c%d-%d", i, seq))
		}
		t0 := time.Now()
		resp, err := l.client.Do(req)
		if err != nil {
			if !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				r.errs++
			}
			continue
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if t0.After(l.measureFrom) || l.o.maxReqs > 0 {
			r.lat = append(r.lat, time.Since(t0))
			r.status[resp.StatusCode]++
		}
	}
	return r
}

// report prints the connections' results over elapsed: a report, or one JSON line.
func (o options) report(results []result, elapsed time.Duration) error {
	var all []time.Duration
	status := map[int]int{}
	errs := 0
	for _, r := range results {
		all = append(all, r.lat...)
		for k, v := range r.status {
			status[k] += v
		}
		errs += r.errs
	}
	if len(all) == 0 {
		return errors.New("no responses")
	}
	slices.Sort(all)
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(float64(len(all))*p))] }
	codes := make([]int, 0, len(status))
	for k := range status {
		codes = append(codes, k)
	}
	sort.Ints(codes)
	var sb strings.Builder
	for _, c := range codes {
		fmt.Fprintf(&sb, "%d=%d ", c, status[c])
	}
	rps := float64(len(all)) / elapsed.Seconds()
	if o.jsonOut {
		fmt.Printf(`{"requests":%d,"rps":%.0f,"p50_us":%d,"p99_us":%d,"max_us":%d,"errors":%d,"status":"%s"}`+"\n",
			len(all), rps, pct(0.50).Microseconds(), pct(0.99).Microseconds(), all[len(all)-1].Microseconds(), errs, strings.TrimSpace(sb.String()))
		return nil
	}
	fmt.Printf("%s %s  c=%d  %v\n", o.method, o.target, o.conns, elapsed.Round(time.Millisecond))
	fmt.Printf("  requests %d  (%.0f/s)  errors %d\n", len(all), rps, errs)
	fmt.Printf("  latency p50 %v  p90 %v  p99 %v  max %v\n", pct(0.50), pct(0.90), pct(0.99), all[len(all)-1])
	fmt.Printf("  status  %s\n", sb.String())
	return nil
}
