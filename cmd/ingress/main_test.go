package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/openapi/openapitest"
	"github.com/sluice-rl/sluice/internal/testenv"
)

// Process tests: real ingress processes, built once per test binary, against real
// redis-server and NATS.

var ingressBin string

// api validates the requests sent to the job API and the admin API of the ingresses the tests
// start (through http.DefaultClient), and their answers, against the OpenAPI documents.
var api *openapitest.Validator

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-ingress-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ingressBin = filepath.Join(dir, "ingress")
	if out, err := exec.Command("go", "build", "-o", ingressBin, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	api = openapitest.Install()
	code := api.Finish(m.Run())
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// ingressProc is one ingress process.
type ingressProc struct {
	t      testing.TB
	cmd    *exec.Cmd
	url    string // its public listener
	admin  string
	stderr *lockedBuffer
	done   chan struct{}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startIngress starts an ingress with config path on free ports and waits until it is ready.
func startIngress(t testing.TB, path string) *ingressProc {
	t.Helper()
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	p := &ingressProc{t: t, url: "http://" + listen, admin: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
		stderr: &lockedBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(ingressBin, "-config", path)
	p.cmd.Env = append(os.Environ(), "SLUICE_LISTEN="+listen, "SLUICE_ADMIN_LISTEN="+p.admin)
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	api.Serve(t, "job", listen)
	api.Serve(t, "admin", p.admin)
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("ingress %s stderr:\n%s", listen, p.stderr.String())
		}
	})
	testenv.WaitFor(t, 30*time.Second, "ingress "+listen+" to be ready", func() bool {
		select {
		case <-p.done:
			t.Fatalf("ingress exited during start-up:\n%s", p.stderr.String())
		default:
		}
		res, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return p
}

// kill kills the process with SIGKILL, as a crash would, and waits for it.
func (p *ingressProc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// slowUpstream counts the requests open at it at once (an atomic high-water mark). A request
// for /work takes 50ms, the request's own work; one for /hold stays until its client goes.
type slowUpstream struct {
	url        string
	open, high atomic.Int64
	served     atomic.Int64
}

func newSlowUpstream(t *testing.T) *slowUpstream {
	u := &slowUpstream{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.open.Add(1)
		defer u.open.Add(-1)
		for h := u.high.Load(); n > h && !u.high.CompareAndSwap(h, n); h = u.high.Load() {
		}
		switch r.URL.Path {
		case "/hold":
			<-r.Context().Done()
			return
		default:
			select {
			case <-time.After(50 * time.Millisecond): // the work the place is for
			case <-r.Context().Done():
				return
			}
		}
		u.served.Add(1)
		io.WriteString(w, "ok")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.url = "http://" + ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return u
}

// TestConcurrencyAcrossIngresses: two ingresses on one redis-server share an algorithm:
// concurrency rule of 4. 64 clients of one key, spread over both, never have more than 4
// requests open at the upstream. Then one ingress is SIGKILLed while it holds all 4 places:
// they stay taken (the other ingress answers 429) until their hold — the rule's timeout plus a
// second — has passed, and are free again right after.
func TestConcurrencyAcrossIngresses(t *testing.T) {
	rs := testenv.Redis(t)
	ns := testenv.NATS(t)
	up := newSlowUpstream(t)
	const timeout = 3 * time.Second
	const hold = timeout + time.Second // the README's bound: timeout plus a second
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	cfg := fmt.Sprintf(`upstream: %s
redis: { url: %q }
nats: { url: %q }
store_timeout: 1s
rules:
  - name: conns
    key: [header:X-API-Key]
    algorithm: concurrency
    limit: 4
    timeout: %s
    on_store_error: deny
`, up.url, rs.URL(), ns.URL, timeout)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	a, b := startIngress(t, path), startIngress(t, path)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	get := func(ctx context.Context, base, target string) (int, http.Header, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+target, nil)
		req.Header.Set("X-API-Key", "k")
		res, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode, res.Header, nil
	}

	// 64 clients, 12 requests each, alternating between the two ingresses.
	const clients, rounds = 64, 12
	var ok, limited atomic.Int64
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range clients {
		wg.Go(func() {
			for j := range rounds {
				base := a.url
				if (i+j)%2 == 1 {
					base = b.url
				}
				code, h, err := get(context.Background(), base, "/work")
				switch {
				case err != nil:
					errs <- err
					return
				case code == http.StatusOK:
					ok.Add(1)
				case code == http.StatusTooManyRequests:
					limited.Add(1)
					if h.Get("RateLimit") != `"conns";r=0` || h.Get("Retry-After") != "" {
						errs <- fmt.Errorf("429 with RateLimit %q, Retry-After %q", h.Get("RateLimit"), h.Get("Retry-After"))
						return
					}
				default:
					errs <- fmt.Errorf("status %d", code)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d forwarded, %d refused in %v; at most %d open at the upstream", ok.Load(), limited.Load(), time.Since(start), up.high.Load())
	if h := up.high.Load(); h > 4 || h < 2 {
		t.Fatalf("%d requests of one key open at the upstream at once; want 2..4 under a limit of 4", h)
	}
	if ok.Load() != up.served.Load() || ok.Load() < 8 || limited.Load() == 0 {
		t.Fatalf("forwarded %d, served %d, refused %d", ok.Load(), up.served.Load(), limited.Load())
	}

	// Ingress a takes all 4 places with requests that stay at the upstream; then it dies.
	up.high.Store(0)
	taken := time.Now()
	// A place is released once its request's handler returns, which can be after its client
	// read the answer: a /hold that finds one of the first part's places not yet released is
	// refused (429) and asks again, until the 4 are held.
	holdCtx, stopHolds := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopHolds()
	for range 4 {
		go func() {
			for holdCtx.Err() == nil {
				// ends with an error when a dies
				if code, _, err := get(holdCtx, a.url, "/hold"); err != nil || code != http.StatusTooManyRequests {
					return
				}
			}
		}()
	}
	testenv.WaitFor(t, 10*time.Second, "4 requests held at the upstream", func() bool { return up.open.Load() == 4 })
	arrived := time.Now()
	a.kill()
	killed := time.Now()
	testenv.WaitFor(t, 10*time.Second, "the upstream to see a's requests go", func() bool { return up.open.Load() == 0 })
	// b is refused until the places expire, then forwards.
	var freed time.Time
	refusals := 0
	testenv.WaitFor(t, hold+5*time.Second, "a place to come back after the hold", func() bool {
		code, _, err := get(context.Background(), b.url, "/work")
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusOK {
			freed = time.Now()
			return true
		}
		if code != http.StatusTooManyRequests {
			t.Fatalf("b answered %d", code)
		}
		refusals++
		return false
	})
	t.Logf("killed %v after the places were taken; freed %v after they were taken (hold %v), %d refusals meanwhile",
		killed.Sub(taken), freed.Sub(taken), hold, refusals)
	if freed.Sub(taken) < hold {
		t.Fatalf("a dead ingress's place came back %v after it was taken, before its hold of %v", freed.Sub(taken), hold)
	}
	if late := freed.Sub(arrived); late > hold+time.Second {
		t.Fatalf("a dead ingress's places came back %v after they were all taken; the bound is %v", late, hold)
	}
	if refusals == 0 {
		t.Fatal("b was never refused while the dead ingress's places were held")
	}
}
