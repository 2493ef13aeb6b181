package testenv

import (
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// PartitionAddr is a second loopback address (Linux routes all of 127.0.0.0/8 to lo): a process
// told to reach a server there, the server bound to it too (RedisWith(t, "--bind", "127.0.0.1",
// PartitionAddr)), can be cut off from it by BlackHole while others reach it at 127.0.0.1.
const PartitionAddr = "127.0.0.2"

// NeedBlackHole skips the test, saying why, unless it runs as root with iptables installed —
// what BlackHole needs. It skips in strict mode too: nothing `make test` installs provides it.
func NeedBlackHole(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("testenv: needs root, to add an iptables rule that drops a process's packets to a server")
	}
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("testenv: needs iptables, to drop a process's packets to a server: " + err.Error())
	}
}

// BlackHole drops every TCP packet this host sends to addr:port — no reset, no answer, as a
// partition or a firewall does — until restore is called or the test ends. cut is taken before
// the rule went in, so the partition began no earlier. Call NeedBlackHole first.
func BlackHole(t testing.TB, addr, port string) (cut time.Time, restore func()) {
	t.Helper()
	rule := []string{"OUTPUT", "-d", addr, "-p", "tcp", "--dport", port, "-j", "DROP"}
	cut = time.Now()
	if out, err := exec.Command("iptables", append([]string{"-A"}, rule...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables -A %s: %v\n%s", strings.Join(rule, " "), err, out)
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
				t.Errorf("iptables -D %s: %v\n%s", strings.Join(rule, " "), err, out)
			}
		})
	}
	t.Cleanup(restore)
	return cut, restore
}

// Poll is one GET of PollGet: when it was sent, how long its answer took, and its status (0
// with Err set when none came).
type Poll struct {
	At   time.Time
	Took time.Duration
	Code int
	Err  error
}

// PollGet GETs url every 25ms, each with a 2s timeout, until the returned function is called
// (or the test ends); that function returns every poll.
func PollGet(t testing.TB, url string) (stop func() []Poll) {
	t.Helper()
	client := &http.Client{Timeout: 2 * time.Second}
	done, exited := make(chan struct{}), make(chan struct{})
	var polls []Poll
	go func() {
		defer close(exited)
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			p := Poll{At: time.Now()}
			resp, err := client.Get(url)
			p.Took, p.Err = time.Since(p.At), err
			if err == nil {
				p.Code = resp.StatusCode
				resp.Body.Close()
			}
			polls = append(polls, p)
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	end := func() { once.Do(func() { close(done); <-exited; client.CloseIdleConnections() }) }
	t.Cleanup(end)
	return func() []Poll { end(); return slices.Clone(polls) }
}

// dropPackets adds an iptables rule that drops every packet this host sends that matches
// match (iptables match options), and removes it when the test ends. Call NeedBlackHole first.
func dropPackets(t testing.TB, match ...string) {
	t.Helper()
	rule := append(append([]string{"OUTPUT"}, match...), "-j", "DROP")
	if out, err := exec.Command("iptables", append([]string{"-A"}, rule...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables -A %s: %v\n%s", strings.Join(rule, " "), err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("iptables", append([]string{"-D"}, rule...)...).CombinedOutput(); err != nil {
			t.Errorf("iptables -D %s: %v\n%s", strings.Join(rule, " "), err, out)
		}
	})
}
