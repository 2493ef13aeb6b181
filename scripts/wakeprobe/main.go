// Command wakeprobe measures how long a job posted to an idle queue takes to reach its upstream
// (scripts/bench-many-queues.sh). It serves the queues' upstream on -listen, and on
// GET /run?samples=K&gap=D&queues=N posts K jobs through the ingress's job API
// (-ingress), one at a time D apart, each to a random queue of q0000..q<N-1>, and answers with
// the latencies' p50, p99 and max in milliseconds: "p50 p99 max". With &seed=S the queues are
// drawn from a generator seeded with S, so a second run with the same seed posts to the same
// queues in the same order (a queue's first job, then a later job on the same idle queue).
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:19700", "the upstream's address")
	ingress := flag.String("ingress", "http://127.0.0.1:19701", "the ingress's public URL")
	flag.Parse()
	var (
		mu      sync.Mutex
		waiting = map[string]chan time.Time{}
	)
	mux := http.NewServeMux()
	mux.HandleFunc("/q/", func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		ch := waiting[string(b)]
		mu.Unlock()
		if ch != nil {
			ch <- at
		}
	})
	mux.HandleFunc("/run", func(w http.ResponseWriter, r *http.Request) {
		samples, _ := strconv.Atoi(r.URL.Query().Get("samples"))
		queues, _ := strconv.Atoi(r.URL.Query().Get("queues"))
		gap, _ := time.ParseDuration(r.URL.Query().Get("gap"))
		pick := rand.IntN
		if seed, err := strconv.ParseUint(r.URL.Query().Get("seed"), 10, 64); err == nil {
			pick = rand.New(rand.NewPCG(seed, seed)).IntN
		}
		var ms []float64
		for i := range max(samples, 1) {
			token := fmt.Sprintf("probe-%d-%d", time.Now().UnixNano(), i)
			ch := make(chan time.Time, 1)
			mu.Lock()
			waiting[token] = ch
			mu.Unlock()
			q := fmt.Sprintf("q%04d", pick(max(queues, 1)))
			sent := time.Now()
			resp, err := http.Post(*ingress+"/v1/queues/"+q+"/jobs", "text/plain", strings.NewReader(token))
			if err != nil || resp.StatusCode != http.StatusAccepted {
				http.Error(w, fmt.Sprintf("post to %s: %v %v", q, err, resp), http.StatusBadGateway)
				return
			}
			resp.Body.Close()
			select {
			case at := <-ch:
				ms = append(ms, float64(at.Sub(sent).Microseconds())/1000)
			case <-time.After(10 * time.Second):
				http.Error(w, "job on "+q+" not delivered within 10s", http.StatusGatewayTimeout)
				return
			}
			time.Sleep(gap)
		}
		slices.Sort(ms)
		// nearest rank: the smallest latency at least p of the samples do not exceed
		rank := func(p float64) float64 { return ms[max(0, int(math.Ceil(p*float64(len(ms))))-1)] }
		fmt.Fprintf(w, "%.1f %.1f %.1f\n", rank(0.5), rank(0.99), ms[len(ms)-1])
	})
	log.Fatal(http.ListenAndServe(*listen, mux))
}
