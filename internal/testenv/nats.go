package testenv

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

func splitHostPort(addr string) (string, string, error) { return net.SplitHostPort(addr) }

// NATSServer is an embedded NATS server with JetStream, started for a test.
type NATSServer struct {
	// URL is the nats:// URL clients connect to.
	URL string
	// Server is the embedded server.
	Server *server.Server
}

// NATSOption changes the options NATS starts its server with.
type NATSOption func(*server.Options)

// StockStore leaves the JetStream store limit to the server, as `nats-server -js -sd DIR` does:
// 75% of the free disk under the store directory, against which every stream's MaxBytes is
// reserved. Without it NATS sets 1 TiB, so that a test's many queues fit on a small disk.
func StockStore() NATSOption { return func(o *server.Options) { o.JetStreamMaxStore = 0 } }

// MaxStore sets the JetStream store limit to n bytes (jetstream { max_file_store: n }).
func MaxStore(n int64) NATSOption { return func(o *server.Options) { o.JetStreamMaxStore = n } }

// NATS starts an embedded NATS server with JetStream on a free loopback port, storing streams in
// a temporary directory, and shuts it down when the test ends. opts change its options.
func NATS(t testing.TB, opts ...NATSOption) *NATSServer {
	t.Helper()
	o := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
		// Streams reserve their max_bytes against this, not against the disk: a test's many
		// queues must not fail on a machine with little free disk.
		JetStreamMaxStore: 1 << 40,
	}
	for _, f := range opts {
		f(o)
	}
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("testenv: nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatalf("testenv: nats server not ready")
	}
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return &NATSServer{URL: s.ClientURL(), Server: s}
}

// Connect returns a connection to url that the test's cleanup closes.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatalf("testenv: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// NATSProcess is nats-server running as a separate process, for tests that crash and restart it.
// Its store directory and port survive Kill and Start, as a real server's would.
type NATSProcess struct {
	URL string

	// Name is the server's name (cluster nodes only).
	Name string

	t     testing.TB
	bin   string
	port  int
	dir   string
	extra []string // cluster arguments
	args  []string // more arguments, as NATSProcIn's caller gave them
	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
}

var (
	buildOnce sync.Once
	buildBin  string
	buildErr  error
)

// natsServerBinary builds the nats-server command from the module this repository requires, once
// per test binary.
func natsServerBinary() (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-nats-server-")
		if err != nil {
			buildErr = err
			return
		}
		bin := filepath.Join(dir, "nats-server")
		cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
			return
		}
		buildBin = bin
	})
	return buildBin, buildErr
}

// NATSProc builds nats-server (once per test binary) and runs it as a separate process with
// JetStream and a file store on a free loopback port. The test's cleanup kills it.
func NATSProc(t testing.TB) *NATSProcess {
	t.Helper()
	return NATSProcIn(t, t.TempDir())
}

// NATSProcIn is NATSProc with its JetStream store in dir, such as a small filesystem a test
// fills up; extra arguments go to nats-server (e.g. "--max_file_store" limits).
func NATSProcIn(t testing.TB, dir string, extra ...string) *NATSProcess {
	t.Helper()
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	p := &NATSProcess{t: t, bin: bin, dir: dir, args: extra}
	var lastErr error
	for range 5 {
		p.port = FreePort(t)
		if lastErr = p.start(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("testenv: start nats-server: %v", lastErr)
	}
	p.URL = fmt.Sprintf("nats://127.0.0.1:%d", p.port)
	t.Cleanup(p.Kill)
	return p
}

func (p *NATSProcess) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("already running")
	}
	args := append([]string{"-a", "127.0.0.1", "-p", itoa(p.port), "-js", "-sd", p.dir}, p.extra...)
	cmd := exec.Command(p.bin, append(args, p.args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	url := fmt.Sprintf("nats://127.0.0.1:%d", p.port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		nc, err := nats.Connect(url, nats.Timeout(200*time.Millisecond))
		if err == nil && p.extra != nil { // a cluster node: JetStream needs its peers too
			nc.Close()
			p.cmd, p.done = cmd, done
			return nil
		}
		if err == nil {
			js, jerr := nc.JetStream()
			if jerr == nil {
				_, jerr = js.AccountInfo()
			}
			nc.Close()
			if jerr == nil {
				p.cmd, p.done = cmd, done
				return nil
			}
			err = jerr
		}
		select {
		case <-done:
			return errors.New("nats-server exited during start-up (port taken?)")
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill kills the server with SIGKILL and waits for it to exit. Killing a stopped server does
// nothing.
func (p *NATSProcess) Kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
	p.cmd, p.done = nil, nil
}

// Stop stops the server with SIGSTOP and returns once the kernel says it is stopped: it keeps
// its connections open and answers nothing, as a server that hangs would. Kill ends it.
func (p *NATSProcess) Stop() {
	p.signal(syscall.SIGSTOP)
	p.mu.Lock()
	pid := p.cmd.Process.Pid
	p.mu.Unlock()
	WaitFor(p.t, 5*time.Second, "nats-server to stop", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		_, rest, ok := strings.Cut(string(b), ") ")
		return err == nil && ok && strings.HasPrefix(rest, "T")
	})
}

func (p *NATSProcess) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		if err := p.cmd.Process.Signal(sig); err != nil {
			p.t.Errorf("testenv: signal nats-server: %v", err)
		}
	}
}

// Start starts the server again after Kill, on the same port and store directory.
func (p *NATSProcess) Start() {
	p.t.Helper()
	if err := p.start(); err != nil {
		p.t.Fatalf("testenv: restart nats-server: %v", err)
	}
}

// NATSClusterServer is a three-node NATS cluster with JetStream, each node a nats-server
// process with its own store, for failover tests.
type NATSClusterServer struct {
	// URL lists the nodes' client URLs, separated by commas.
	URL   string
	Nodes []*NATSProcess
}

// NATSCluster starts a three-node JetStream cluster on loopback and waits until JetStream
// answers; the test's cleanup kills it.
func NATSCluster(t testing.TB) *NATSClusterServer {
	t.Helper()
	bin, err := natsServerBinary()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	c := &NATSClusterServer{}
	routes := make([]int, 3)
	var urls, routeURLs []string
	for i := range 3 {
		routes[i] = FreePort(t)
		routeURLs = append(routeURLs, fmt.Sprintf("nats://127.0.0.1:%d", routes[i]))
	}
	for i := range 3 {
		p := &NATSProcess{t: t, bin: bin, dir: t.TempDir(), port: FreePort(t), Name: fmt.Sprintf("n%d", i+1)}
		p.extra = []string{"-n", p.Name, "--cluster_name", "sluice-test",
			"--cluster", routeURLs[i], "--routes", strings.Join(routeURLs, ",")}
		if err := p.start(); err != nil {
			t.Fatalf("testenv: start nats-server %s: %v", p.Name, err)
		}
		p.URL = fmt.Sprintf("nats://127.0.0.1:%d", p.port)
		t.Cleanup(p.Kill)
		c.Nodes = append(c.Nodes, p)
		urls = append(urls, p.URL)
	}
	c.URL = strings.Join(urls, ",")
	// Every node must answer JetStream's API, not just one: a client may connect to any of
	// them, and one that has not caught up with the meta leader yet has no responders.
	for _, u := range urls {
		nc, err := nats.Connect(u)
		if err != nil {
			t.Fatal(err)
		}
		WaitFor(t, 30*time.Second, "JetStream to answer on "+u, func() bool {
			js, err := nc.JetStream(nats.MaxWait(time.Second))
			if err != nil {
				return false
			}
			_, err = js.AccountInfo()
			return err == nil
		})
		nc.Close()
	}
	return c
}

// StreamLeader returns the node that leads stream, asking through nc.
func (c *NATSClusterServer) StreamLeader(t testing.TB, nc *nats.Conn, stream string) *NATSProcess {
	t.Helper()
	var leader string
	WaitFor(t, 30*time.Second, "a leader of stream "+stream, func() bool {
		js, err := nc.JetStream(nats.MaxWait(time.Second))
		if err != nil {
			return false
		}
		info, err := js.StreamInfo(stream)
		if err != nil || info.Cluster == nil {
			return false
		}
		leader = info.Cluster.Leader
		return leader != ""
	})
	for _, n := range c.Nodes {
		if n.Name == leader {
			return n
		}
	}
	t.Fatalf("testenv: stream %s is led by unknown server %q", stream, leader)
	return nil
}
