// Command upstream is the no-op upstream of cmd/worker's accuracy test, run as a process of its
// own and built without -race, like the workers: in the race-instrumented test binary, serving
// thousands of requests a second costs as much CPU as a worker, which on a 2-core machine is
// taken from the workers it measures. It answers every request with 200 — except under
// /limited/N/, which takes N requests a second (a token bucket, burst 5) and answers the rest
// 429 with Retry-After: 1, as a rate-limited API does — and writes one line per request to
// stdout, flushed at once:
//
//	<arrival, Unix ns> <Sluice-Job, else Idempotency-Key, or -> <Sluice-Attempt or -> <request URI> <status>
//
// The first line is its base URL. It runs until it is killed.
package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := bufio.NewWriter(os.Stdout)
	var mu sync.Mutex
	fmt.Fprintf(out, "http://%s\n", ln.Addr())
	out.Flush()
	orDash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	limiters := map[string]*rate.Limiter{}
	err = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		status := http.StatusOK
		if rest, ok := strings.CutPrefix(r.URL.Path, "/limited/"); ok {
			n, _, _ := strings.Cut(rest, "/")
			l := limiters[n]
			if l == nil {
				per, _ := strconv.Atoi(n)
				l = rate.NewLimiter(rate.Limit(max(per, 1)), 5)
				limiters[n] = l
			}
			if !l.AllowN(at, 1) {
				status = http.StatusTooManyRequests
				w.Header().Set("Retry-After", "1")
			}
		}
		w.WriteHeader(status)
		id := r.Header.Get("Sluice-Job")
		if id == "" { // BullMQ's and the bare JetStream consumer's deliveries (bench-peers.sh)
			id = r.Header.Get("Idempotency-Key")
		}
		fmt.Fprintf(out, "%d %s %s %s %d\n", at.UnixNano(), orDash(id),
			orDash(r.Header.Get("Sluice-Attempt")), r.RequestURI, status)
		err := out.Flush()
		mu.Unlock()
		if err != nil {
			os.Exit(1) // the test is gone
		}
	}))
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}
