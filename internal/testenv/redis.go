package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisServer is a redis-server process started for a test. Its methods are safe for concurrent
// use.
type RedisServer struct {
	// Addr is host:port of the server; it stays the same across Stop and Start.
	Addr string
	// Client is a go-redis client for Addr, closed at cleanup.
	Client *redis.Client

	t    testing.TB
	bin  string
	dir  string
	args []string // extra redis-server arguments
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	// held keeps Addr while the server is stopped (see Stop); nil when not held.
	held net.Listener
	// heldDone is closed when held's accept loop has returned.
	heldDone chan struct{}
}

// Redis starts a redis-server on a free loopback port with persistence off, and stops it when
// the test ends. It skips the test (fails in strict mode) when redis-server is not installed.
func Redis(t testing.TB) *RedisServer {
	t.Helper()
	return RedisWith(t)
}

// RedisWith is Redis with more redis-server arguments (for example a renamed command).
func RedisWith(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		unavailable(t, "redis-server not found in PATH (install: apt-get install -y redis-server)")
	}
	s := &RedisServer{t: t, bin: bin, dir: t.TempDir(), args: args}
	var lastErr error
	for range 5 { // a port found free can be taken before redis binds it; try another
		s.Addr = "127.0.0.1:" + itoa(FreePort(t))
		if lastErr = s.start(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		unavailable(t, "start redis-server: %v", lastErr)
	}
	s.Client = s.NewClient()
	t.Cleanup(func() {
		s.Client.Close()
		s.shutdown()
	})
	return s
}

// NewClient returns a new go-redis client for the server; the test's cleanup closes it.
func (s *RedisServer) NewClient() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	s.t.Cleanup(func() { c.Close() })
	return c
}

// URL returns the server's redis:// URL.
func (s *RedisServer) URL() string { return "redis://" + s.Addr + "/0" }

func (s *RedisServer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return errors.New("already running")
	}
	s.release()
	_, port, _ := splitHostPort(s.Addr)
	cmd := exec.Command(s.bin, append([]string{
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no", "--daemonize", "no", "--loglevel", "warning"}, s.args...)...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		// A server started with --requirepass answers NOAUTH: it is up.
		if err == nil || strings.HasPrefix(err.Error(), "NOAUTH") {
			s.cmd, s.done = cmd, done
			return nil
		}
		select {
		case <-done:
			return errors.New("redis-server exited during start-up (port taken?)")
		default:
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-done
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Start starts the server again after Stop, on the same address, with an empty dataset.
func (s *RedisServer) Start() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("testenv: restart redis-server on %s: %v", s.Addr, err)
	}
}

// Stop kills the server (SIGKILL, as a crash would) and waits until it has exited. Stopping a
// stopped server does nothing. Until Start, the address stays taken by a listener that closes
// every connection at once, as a dead server's would be refused: a port given up while other
// test processes start servers on free ports could be taken by one of them, and the stopped
// server's clients would then find a server again.
func (s *RedisServer) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.kill() {
		return
	}
	l, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return // taken already: nothing to hold
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	s.held, s.heldDone = l, done
}

// running reports whether the server runs (was started and not stopped).
func (s *RedisServer) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// shutdown stops the server for good, at the test's end: killed, its address not held.
func (s *RedisServer) shutdown() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kill()
	s.release()
}

// kill kills the server and waits for it to exit, and reports whether it was running. s.mu is
// held.
func (s *RedisServer) kill() bool {
	if s.cmd == nil {
		return false
	}
	s.cmd.Process.Kill()
	<-s.done
	s.cmd, s.done = nil, nil
	return true
}

// release frees the address Stop held, if it did. s.mu is held.
func (s *RedisServer) release() {
	if s.held == nil {
		return
	}
	s.held.Close()
	<-s.heldDone
	s.held, s.heldDone = nil, nil
}

// Pause stops the server with SIGSTOP and returns once the kernel says it is stopped: it keeps
// its connections and its data, and answers nothing, as a stalled or overloaded server would.
// Resume continues it. Pausing a server not running fails the test.
func (s *RedisServer) Pause() {
	s.t.Helper()
	pid := s.signal(syscall.SIGSTOP)
	WaitFor(s.t, 5*time.Second, "redis-server to stop", func() bool { return procState(pid) == "T" })
}

// Resume continues a server Pause stopped (SIGCONT) and returns once the kernel says it runs.
func (s *RedisServer) Resume() {
	s.t.Helper()
	pid := s.signal(syscall.SIGCONT)
	WaitFor(s.t, 5*time.Second, "redis-server to continue", func() bool {
		st := procState(pid)
		return st != "" && st != "T"
	})
}

// signal sends sig to the running server and returns its pid.
func (s *RedisServer) signal(sig syscall.Signal) int {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("testenv: signal redis-server on %s: not running", s.Addr)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("testenv: signal redis-server on %s: %v", s.Addr, err)
	}
	return s.cmd.Process.Pid
}

// procState is the state letter of process pid in /proc/pid/stat ("R", "S", "T", ...), or ""
// when it cannot be read.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	_, rest, ok := strings.Cut(string(b), ") ")
	if !ok || rest == "" {
		return ""
	}
	return rest[:1]
}
