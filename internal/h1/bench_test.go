package h1_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/h1"
)

// BenchmarkDo compares a Client with net/http's Transport (as the worker sets it up: no
// compression, no redirects) on one loopback server in the same process: "parallel" sends
// back to back from GOMAXPROCS goroutines; "paced" sends one request every millisecond from one
// goroutine, as a throttled drain does, and reports the process's CPU time per request
// (client and server: the server's share is the same for both).
//
//	go test -run '^$' -bench BenchmarkDo -benchtime 4000x ./internal/h1/
func BenchmarkDo(b *testing.B) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"ok":true}`))
	}))
	defer s.Close()
	nethttp := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 64},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	direct := &h1.Client{Dial: (&net.Dialer{}).DialContext}
	defer direct.CloseIdleConnections()
	defer nethttp.CloseIdleConnections()
	for _, c := range []struct {
		name string
		do   func(*http.Request) (*http.Response, error)
	}{{"h1", direct.Do}, {"net-http", nethttp.Do}} {
		send := func(b *testing.B) {
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, s.URL+"/q", strings.NewReader(`{"job":1}`))
			req.Header.Set("Idempotency-Key", "k")
			resp, err := c.do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					send(b)
				}
			})
		})
		b.Run(c.name+"/paced", func(b *testing.B) {
			b.ReportAllocs()
			send(b) // the connection made
			t := time.NewTicker(time.Millisecond)
			defer t.Stop()
			cpu0 := cpu()
			b.ResetTimer()
			for range b.N {
				<-t.C
				send(b)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpu()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpu is the process's user and system time.
func cpu() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
