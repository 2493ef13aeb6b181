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

func main() {
	var (
		target   = flag.String("url", "", "URL to load (loopback only)")
		method   = flag.String("method", "GET", "HTTP method")
		body     = flag.String("body", "", "request body")
		conns    = flag.Int("c", 64, "concurrent connections")
		dur      = flag.Duration("d", 10*time.Second, "duration")
		maxReqs  = flag.Int("n", 0, "stop after this many requests (0 = duration only)")
		uniqKey  = flag.String("unique-header", "", "header set to a unique value per request (e.g. X-API-Key)")
		hdrs     headers
		warmup   = flag.Duration("warmup", time.Second, "run this long before measuring")
		jsonOnly = flag.Bool("json", false, "print one JSON line instead of the report")
	)
	flag.Var(&hdrs, "header", "request header 'Name: value' (repeatable)")
	flag.Parse()
	if err := run(*target, *method, *body, hdrs, *uniqKey, *conns, *dur, *warmup, *maxReqs, *jsonOnly); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
}

func run(target, method, body string, hdrs []string, uniqKey string, conns int, dur, warmup time.Duration, maxReqs int, jsonOut bool) error {
	u, err := url.Parse(target)
	if err != nil || u.Host == "" {
		return fmt.Errorf("-url %q: want an absolute URL", target)
	}
	if ip := net.ParseIP(u.Hostname()); !(u.Hostname() == "localhost" || (ip != nil && ip.IsLoopback())) {
		return fmt.Errorf("-url %q: only loopback targets are allowed", target)
	}
	h := http.Header{}
	for _, kv := range hdrs {
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return fmt.Errorf("-header %q: want 'Name: value'", kv)
		}
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	tr := &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()

	ctx, cancel := context.WithTimeout(context.Background(), warmup+dur)
	defer cancel()
	start := time.Now()
	measureFrom := start.Add(warmup)

	type result struct {
		lat    []time.Duration
		status map[int]int
		errs   int
	}
	results := make([]result, conns)
	var sent sync.WaitGroup
	var counter struct {
		sync.Mutex
		n int
	}
	for i := range conns {
		sent.Add(1)
		go func(i int) {
			defer sent.Done()
			r := result{status: map[int]int{}}
			for seq := 0; ctx.Err() == nil; seq++ {
				if maxReqs > 0 {
					counter.Lock()
					if counter.n >= maxReqs {
						counter.Unlock()
						break
					}
					counter.n++
					counter.Unlock()
				}
				req, _ := http.NewRequestWithContext(ctx, method, target, bytes.NewReader([]byte(body)))
				req.Header = h.Clone()
				if uniqKey != "" {
					req.Header.Set(uniqKey, fmt.Sprintf("c%d-%d", i, seq))
				}
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
						r.errs++
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if t0.After(measureFrom) || maxReqs > 0 {
					r.lat = append(r.lat, time.Since(t0))
					r.status[resp.StatusCode]++
				}
			}
			results[i] = r
		}(i)
	}
	sent.Wait()
	elapsed := time.Since(measureFrom)
	if maxReqs > 0 {
		elapsed = time.Since(start)
	}

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
	if jsonOut {
		fmt.Printf(`{"requests":%d,"rps":%.0f,"p50_us":%d,"p99_us":%d,"max_us":%d,"errors":%d,"status":"%s"}`+"\n",
			len(all), rps, pct(0.50).Microseconds(), pct(0.99).Microseconds(), all[len(all)-1].Microseconds(), errs, strings.TrimSpace(sb.String()))
		return nil
	}
	fmt.Printf("%s %s  c=%d  %v\n", method, target, conns, elapsed.Round(time.Millisecond))
	fmt.Printf("  requests %d  (%.0f/s)  errors %d\n", len(all), rps, errs)
	fmt.Printf("  latency p50 %v  p90 %v  p99 %v  max %v\n", pct(0.50), pct(0.90), pct(0.99), all[len(all)-1])
	fmt.Printf("  status  %s\n", sb.String())
	return nil
}
