package client_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/retry"
	"github.com/sluice-rl/sluice/retry/retrytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var t0 = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)

// noJitter is a policy whose waits are exact, so tests can assert them.
var noJitter = retry.Policy{Initial: time.Second, Max: 8 * time.Second, Jitter: -1, MaxAttempts: 5}

// seen is one request as the test server received it.
type seen struct {
	Method, Path, RawQuery string
	EscapedPath            string
	Header                 http.Header
	Body                   string
}

// scripted is an httptest server that answers its n-th request with steps[n] (the last step
// repeats) and records every request.
type scripted struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
}

func newScripted(t *testing.T, steps ...http.HandlerFunc) *scripted {
	t.Helper()
	s := &scripted{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.reqs)
		s.reqs = append(s.reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.URL.EscapedPath(), r.Header.Clone(), string(body)})
		s.mu.Unlock()
		steps[min(n, len(steps)-1)](w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *scripted) requests() []seen {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]seen(nil), s.reqs...)
}

// reply returns a step that answers status with the given header pairs and body.
func reply(status int, body string, kv ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(kv); i += 2 {
			w.Header().Add(kv[i], kv[i+1])
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// newClient returns a client of srv on an auto-advancing fake clock: every wait returns at
// once and is recorded in the returned clock's Waits.
func newClient(t *testing.T, srv *httptest.Server, opts ...client.Option) (*client.Client, *retrytest.Clock) {
	t.Helper()
	clock := retrytest.NewAutoClock(t0)
	all := append([]client.Option{client.WithHTTPClient(srv.Client()), client.WithClock(clock), client.WithPolicy(noJitter)}, opts...)
	c, err := client.New(srv.URL, all...)
	if err != nil {
		t.Fatal(err)
	}
	return c, clock
}
