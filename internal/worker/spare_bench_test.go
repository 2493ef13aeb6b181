//go:build unix

package worker

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// BenchmarkDialAhead measures what the connections dialed ahead (spares) buy: the time from a
// job's slot to its request written, for deliveries that each need a new connection (the
// upstream closes every connection after its answer), while two processes keep both cores
// busy, as a worker's neighbours do when a drain starts. "ahead" is the Pool's own client,
// warmed while the job waits for its slot (5ms here); "on-demand", the same transport dialing
// after the slot. It reports the p50 and p99 of that time, and the largest.
//
//	go test -run '^$' -bench DialAhead -benchtime 1x ./internal/worker/
func BenchmarkDialAhead(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Connection", "close")
	}))
	defer up.Close()
	for _, name := range []string{"ahead", "on-demand"} {
		b.Run(name, func(b *testing.B) {
			stop := burnCores(b, 2)
			defer stop()
			client, sp, _ := defaultClient()
			if name == "on-demand" {
				client.Transport.(*http.Transport).DialContext = (&net.Dialer{Timeout: 30 * time.Second}).DialContext
				sp.close()
				sp = nil
			}
			defer client.CloseIdleConnections()
			if sp != nil {
				defer sp.close()
			}
			n := max(b.N, 200)
			waits := make([]time.Duration, 0, n)
			b.ResetTimer()
			for range n {
				if sp != nil {
					sp.warm(up.URL)
				}
				time.Sleep(5 * time.Millisecond) // the job waits for its slot
				slot := time.Now()
				var written time.Duration
				ctx := withWrote(context.Background(), func() { written = time.Since(slot) })
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, up.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
				waits = append(waits, written)
			}
			b.StopTimer()
			slices.Sort(waits)
			b.ReportMetric(float64(waits[len(waits)/2].Microseconds()), "µs-p50")
			b.ReportMetric(float64(waits[len(waits)*99/100].Microseconds()), "µs-p99")
			b.ReportMetric(float64(waits[len(waits)-1].Microseconds()), "µs-max")
		})
	}
}

// burnCores starts n processes that spin until stop is called.
func burnCores(b *testing.B, n int) (stop func()) {
	var cmds []*exec.Cmd
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	return func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
}

// withWrote returns ctx with a trace that calls fn when the request has been written.
func withWrote(ctx context.Context, fn func()) context.Context {
	return httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { fn() },
	})
}

// BenchmarkSparesWarm is what warming costs a job while its upstream's spare is parked, the
// case of every job but those that find none: the target's address looked up, the spare
// found young and open (a non-blocking peek at most every spareCheckEvery).
//
//	go test -run '^$' -bench SparesWarm ./internal/worker/
func BenchmarkSparesWarm(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	sp := newSpares(&net.Dialer{}, nil)
	defer sp.close()
	target := up.URL + "/orders"
	sp.warm(target)
	waitParked(sp, up.URL)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			sp.warm(target)
		}
	})
}

// BenchmarkPoolDo is one delivery's request through Pool.do as the Pool's own client sends
// it: to a plain http:// upstream on loopback, the direct path (whether a proxy serves the
// host, then package h1) on kept-alive connections. The proxy is the environment's, read
// once per process: run it with HTTP_PROXY set too to price the check a proxied environment
// costs each request (loopback is never proxied, but is checked).
//
//	go test -run '^$' -bench PoolDo -benchtime 20000x ./internal/worker/
func BenchmarkPoolDo(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"ok":true}`))
	}))
	defer up.Close()
	client, sp, d := defaultClient()
	p := &Pool{client: client, spares: sp, direct: d}
	defer func() { client.CloseIdleConnections(); d.h1.CloseIdleConnections(); sp.close() }()
	probe, _ := http.NewRequest(http.MethodPost, up.URL, nil)
	if !d.serves(probe) {
		b.Fatal("the direct path does not serve the loopback upstream")
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, up.URL+"/q", strings.NewReader(`{"job":1}`))
			req.Header.Set("Idempotency-Key", "k")
			resp, err := p.do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}
