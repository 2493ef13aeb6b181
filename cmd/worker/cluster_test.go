package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// workerBin is the worker command, built once per test binary (without -race: the workers'
// timing is what the tests measure).
var workerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-worker-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	workerBin = filepath.Join(dir, "worker")
	upstreamBin = filepath.Join(dir, "upstream")
	// One go build for both commands: it links them at once, where two builds linked one after
	// the other. With -o naming a directory, each lands there under its package's name.
	if out, err := exec.Command("go", "build", "-o", dir+string(filepath.Separator), ".", "./testdata/upstream").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build . ./testdata/upstream: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// ackWait is the consumers' AckWait in these tests, short so that the jobs of a killed worker
// come back quickly.
const ackWait = time.Second

// cluster is one process test's world: redis-server and nats-server processes, a recording
// upstream, the queue layer (to publish and read statuses), and worker processes.
type cluster struct {
	t     testing.TB
	ctx   context.Context
	redis *testenv.RedisServer
	nats  *testenv.NATSProcess
	up    *workertest.Recorder
	qs    *queue.Queues
	js    jetstream.JetStream
	dir   string
	// shared is the configs' nats.shared_streams, and qs's: the default unless a test calls
	// ownStreams (the configs then say shared_streams: 0).
	shared int
	// redisURL, when set, replaces the redis-server's URL in the configs (a Redis Cluster).
	redisURL string
	// upstreamURL, when set, replaces up as the configs' upstream, where deferred jobs go.
	upstreamURL string
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	return newClusterOn(t, testenv.Redis(t))
}

// newClusterOn is newCluster with the redis-server rs.
func newClusterOn(t testing.TB, rs *testenv.RedisServer) *cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c := &cluster{t: t, ctx: ctx, redis: rs, nats: testenv.NATSProc(t),
		up: workertest.NewRecorder(t), dir: t.TempDir(), shared: config.DefaultSharedStreams}
	var err error
	if c.js, err = jetstream.New(testenv.Connect(t, c.nats.URL)); err != nil {
		t.Fatal(err)
	}
	if c.qs, err = queue.New(ctx, c.js, queue.Options{SharedStreams: c.shared}); err != nil {
		t.Fatal(err)
	}
	return c
}

// ownStreams makes the cluster's configs, and its queue layer, give every queue a stream of
// its own (nats.shared_streams: 0), for tests of that mode; call it before config.
func (c *cluster) ownStreams() {
	c.t.Helper()
	c.shared = 0
	var err error
	if c.qs, err = queue.New(c.ctx, c.js, queue.Options{}); err != nil {
		c.t.Fatal(err)
	}
}

// config writes a config file with queues (YAML list items, indented by two spaces) and the
// cluster's servers and upstream, provisions its queues as the workers will, and returns its
// path.
func (c *cluster) config(queues string) string {
	c.t.Helper()
	path := filepath.Join(c.dir, "sluice.yaml")
	c.writeConfig(path, queues)
	cfg, err := config.Load(path)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := c.qs.Provision(c.ctx, app.QueueSpecs(cfg)); err != nil {
		c.t.Fatal(err)
	}
	return path
}

func (c *cluster) writeConfig(path, queues string) {
	c.t.Helper()
	c.writeConfigShared(path, queues, c.shared)
}

// writeConfigShared is writeConfig with nats.shared_streams n: unset (the default) when n is
// config.DefaultSharedStreams, so that the tests run what a config that says nothing gets.
func (c *cluster) writeConfigShared(path, queues string, n int) {
	c.t.Helper()
	shared := ""
	if n != config.DefaultSharedStreams {
		shared = fmt.Sprintf("shared_streams: %d, ", n)
	}
	yaml := fmt.Sprintf(`upstream: %s
admin_listen: 127.0.0.1:1
redis: { url: %q }
nats: { %surl: %q }
shutdown_timeout: 5s
queues:
%s`, cmp.Or(c.upstreamURL, c.up.URL), c.redisURLOrDefault(), shared, c.nats.URL, queues)
	// Write and rename, as editors do, so a watching worker never reads half a file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) redisURLOrDefault() string {
	if c.redisURL != "" {
		return c.redisURL
	}
	return c.redis.URL()
}

// queueYAML is one queue's config: direct jobs go to the upstream's /q/<name>.
func (c *cluster) queueYAML(name, rate string, extra ...string) string {
	return c.queueYAMLTo(c.up.URL, name, rate, extra...)
}

// queueYAMLTo is queueYAML with direct jobs going to upstreamURL + /q/<name>.
func (c *cluster) queueYAMLTo(upstreamURL, name, rate string, extra ...string) string {
	s := fmt.Sprintf("  - name: %s\n    rate: %s\n    target: POST %s/q/%s\n    backoff: { initial: 100ms, max: 1s }\n    timeout: 2s\n    ack_wait: %s\n",
		name, rate, upstreamURL, name, ackWait)
	for _, e := range extra {
		s += "    " + e + "\n"
	}
	return s
}

// proc is one worker process.
type proc struct {
	t      testing.TB
	cmd    *exec.Cmd
	admin  string
	stderr *syncBuffer
	done   chan struct{}
	err    error // Wait's result, once done is closed
}

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// spawn starts a worker process with config path and waits until /readyz says it drains.
func (c *cluster) spawn(path string) *proc {
	c.t.Helper()
	p := spawn(c.t, path)
	p.waitReady()
	return p
}

// spawn starts a worker process without waiting for it; its admin listener is on a free port.
func spawn(t testing.TB, path string, args ...string) *proc {
	t.Helper()
	return spawnBin(t, workerBin, path, args...)
}

// spawnBin is spawn with the worker binary bin.
func spawnBin(t testing.TB, bin, path string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, admin: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, append([]string{"-config", path}, args...)...)
	p.cmd.Env = append(os.Environ(), "SLUICE_ADMIN_LISTEN="+p.admin)
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("worker %s stderr (last 1500 bytes):\n%s", p.admin, tail(p.stderr.String(), 1500))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// waitReady waits until the worker's /readyz answers 200.
func (p *proc) waitReady() {
	p.t.Helper()
	testenv.WaitFor(p.t, 30*time.Second, "worker "+p.admin+" to be ready", func() bool {
		select {
		case <-p.done:
			p.t.Fatalf("worker exited during start-up: %v\n%s", p.err, p.stderr.String())
		default:
		}
		resp, err := http.Get("http://" + p.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// kill kills the process with SIGKILL, as a crash would, and waits for it.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Kill()
	<-p.done
}

// exit waits for the process to exit, at most timeout, and returns its exit code.
func (p *proc) exit(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		p.t.Fatalf("worker did not exit within %v", timeout)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		p.t.Fatalf("worker: %v", p.err)
	}
	return 0
}

// metrics returns the worker's /metrics text.
func (p *proc) metrics() string {
	p.t.Helper()
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metricValue returns the value of the sample whose line starts with series (name and
// labels as exposed) in text, and whether there is one.
func metricValue(text, series string) (float64, bool) {
	for _, line := range strings.Split(text, "\n") {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			var v float64
			if _, err := fmt.Sscan(rest, &v); err == nil {
				return v, true
			}
		}
	}
	return 0, false
}
