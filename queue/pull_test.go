package queue_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/queue"
)

// stallProxy passes TCP between a loopback listener and a NATS server, holding each chunk the
// server sends for the delay it holds (ns) first: a server or a network that stalls.
type stallProxy struct {
	addr  string
	delay atomic.Int64
}

func newStallProxy(t *testing.T, server string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{addr: ln.Addr().String()}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	t.Cleanup(func() { // after the connections through it are closed (registered later)
		p.delay.Store(0)
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	server = strings.TrimPrefix(server, "nats://")
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", server)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(s, c); s.Close() })
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						if d := time.Duration(p.delay.Load()); d > 0 {
							time.Sleep(d) // the stall itself, not a wait for a condition
						}
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return p
}

// stalledFetch stores jobs jobs, has the proxy hold the server's answer to a Fetch(jobs, wait)
// for hold, and returns what that fetch got and when the hold ended.
func stalledFetch(t *testing.T, b *bundle, p *stallProxy, c *queue.Consumer, jobs int, wait, hold time.Duration) ([]*queue.Msg, time.Time) {
	t.Helper()
	for range jobs {
		b.publish(&queue.Job{Queue: "q"})
	}
	p.delay.Store(int64(hold))
	start := time.Now()
	got, err := c.Fetch(b.ctx, jobs, wait)
	p.delay.Store(0)
	if err != nil {
		t.Fatalf("fetch under a stall of %v: %v", hold, err)
	}
	return got, start.Add(hold)
}

// fetchAll fetches until want jobs in all (with got) came or limit passed, and returns them.
func fetchAll(t *testing.T, b *bundle, c *queue.Consumer, got []*queue.Msg, want int, limit time.Duration) []*queue.Msg {
	t.Helper()
	deadline := time.Now().Add(limit)
	for len(got) < want && time.Now().Before(deadline) {
		msgs, err := c.Fetch(b.ctx, want-len(got), 200*time.Millisecond)
		if err != nil {
			t.Fatalf("fetch after the stall: %v", err)
		}
		got = append(got, msgs...)
	}
	return got
}

// checkNotStranded fails unless all jobs were fetched soon after the hold ended (not after
// the queue's AckWait of 30 s), each once and on its first delivery.
func checkNotStranded(t *testing.T, b *bundle, got []*queue.Msg, jobs int, holdEnd time.Time) {
	t.Helper()
	if len(got) != jobs {
		t.Fatalf("%d of %d jobs fetched within 5 s of the stall's end (the rest stranded until AckWait)", len(got), jobs)
	}
	if el := time.Since(holdEnd); el > 3*time.Second {
		t.Fatalf("the jobs came %v after the stall's end", el)
	}
	seen := map[string]bool{}
	for _, m := range got {
		if seen[m.Job.ID] {
			t.Fatalf("job %s fetched twice", m.Job.ID)
		}
		seen[m.Job.ID] = true
		if m.Delivered != 1 {
			t.Errorf("job %s: delivered %d times, want 1 (a late job kept for the next fetch is the same delivery)", m.Job.ID, m.Delivered)
		}
		if err := m.Ack(b.ctx); err != nil {
			t.Fatalf("ack job %s: %v", m.Job.ID, err)
		}
	}
	if n := b.depth("q"); n != 0 {
		t.Fatalf("%d jobs left in the queue after acking all", n)
	}
}

// A no-wait fetch whose answer the network holds past the fetch's 1 s give-up returns without
// the jobs; they come with the next fetches, not after AckWait (nats.go's FetchNoWait left them
// pending, held by no one, for 30 s: docs/design/start-window.md).
func TestFetchNoWaitStalledAnswerNotStranded(t *testing.T) {
	srv := testenv.NATS(t)
	p := newStallProxy(t, srv.URL)
	b := setupURL(t, "nats://"+p.addr, queue.Options{}, queue.Spec{Name: "q", AckWait: 30 * time.Second})
	c := b.consumer("q")
	const jobs = 4
	got, holdEnd := stalledFetch(t, b, p, c, jobs, 0, 1500*time.Millisecond)
	t.Logf("no-wait fetch under a 1.5 s stall returned %d jobs", len(got))
	got = fetchAll(t, b, c, got, jobs, 5*time.Second)
	checkNotStranded(t, b, got, jobs, holdEnd)
}

// The same at a long pull's end: its context ends while the server's answer is held, and the
// jobs sent meanwhile are fetched next.
func TestFetchLongPullEndStalledAnswerNotStranded(t *testing.T) {
	srv := testenv.NATS(t)
	p := newStallProxy(t, srv.URL)
	b := setupURL(t, "nats://"+p.addr, queue.Options{}, queue.Spec{Name: "q", AckWait: 30 * time.Second})
	c := b.consumer("q")
	const jobs = 3
	got, holdEnd := stalledFetch(t, b, p, c, jobs, 400*time.Millisecond, 1500*time.Millisecond)
	t.Logf("400 ms fetch under a 1.5 s stall returned %d jobs", len(got))
	got = fetchAll(t, b, c, got, jobs, 5*time.Second)
	checkNotStranded(t, b, got, jobs, holdEnd)
}

// Late jobs that come while no fetch of their consumer waits in the process are kept for its
// next fetch, which returns them at once as the same delivery: a worker busy with a job when
// they come spends no attempt on them.
func TestFetchLateJobsKeptForNextFetch(t *testing.T) {
	srv := testenv.NATS(t)
	p := newStallProxy(t, srv.URL)
	b := setupURL(t, "nats://"+p.addr, queue.Options{}, queue.Spec{Name: "q", AckWait: 30 * time.Second})
	c := b.consumer("q")
	const jobs = 3
	got, holdEnd := stalledFetch(t, b, p, c, jobs, 0, 1500*time.Millisecond)
	if len(got) != 0 { // it gives up after 1 s
		t.Fatalf("a no-wait fetch under a 1.5 s stall got %d jobs", len(got))
	}
	testenv.WaitFor(t, 5*time.Second, "the late jobs kept", func() bool { return queue.LateKept(b.q) == jobs })
	got, err := c.Fetch(b.ctx, jobs+1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if queue.LateKept(b.q) != 0 {
		t.Fatalf("%d late jobs still kept after a fetch took them", queue.LateKept(b.q))
	}
	checkNotStranded(t, b, got, jobs, holdEnd)
}

// Late jobs that no fetch of this process takes within their hold (here 300 ms) are handed
// back at once (NAK), not held until AckWait: another process gets them, one delivery later.
func TestFetchLateJobsHandedBack(t *testing.T) {
	srv := testenv.NATS(t)
	p := newStallProxy(t, srv.URL)
	spec := queue.Spec{Name: "q", AckWait: 30 * time.Second}
	b := setupURL(t, "nats://"+p.addr, queue.Options{}, spec)
	other := setupURL(t, srv.URL, queue.Options{Prefix: b.prefix}, spec)
	queue.SetLateHold(b.q, 300*time.Millisecond)
	const jobs = 3
	got, holdEnd := stalledFetch(t, b, p, b.consumer("q"), jobs, 0, 2*time.Second)
	if len(got) != 0 { // it gives up after 1 s
		t.Fatalf("a no-wait fetch under a 2 s stall got %d jobs", len(got))
	}
	got = fetchAll(t, other, other.consumer("q"), nil, jobs, 5*time.Second)
	if len(got) != jobs {
		t.Fatalf("the other process fetched %d of %d late jobs within 5 s", len(got), jobs)
	}
	if el := time.Since(holdEnd); el > 3*time.Second {
		t.Fatalf("the late jobs came to the other process %v after the stall's end", el)
	}
	for _, m := range got {
		if m.Delivered != 2 {
			t.Errorf("job %s: delivered %d times, want 2 (the late delivery, then this one)", m.Job.ID, m.Delivered)
		}
		if err := m.Ack(b.ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A long pull cut short stays waiting at the server until it expires; the next job must not go
// to it (it would come late to a process that may fetch no more) but to whoever fetches next.
func TestFetchCutLongPullTakesNoJob(t *testing.T) {
	spec := queue.Spec{Name: "q", AckWait: 30 * time.Second}
	b := setup(t, queue.Options{}, spec)
	other := setupURL(t, b.url, queue.Options{Prefix: b.prefix}, spec)
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	cons, err := b.js.Consumer(b.ctx, b.stream("q"), "workers")
	if err != nil {
		t.Fatal(err)
	}
	cut := make(chan struct{})
	go func() { // cut the pull once the server has it
		defer close(cut)
		defer cancel()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if ci, err := cons.Info(b.ctx); err == nil && ci.NumWaiting == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Error("the long pull was not waiting at the server within 5 s")
				return
			}
		}
	}()
	msgs, err := b.consumer("q").Fetch(ctx, 1, 30*time.Second)
	<-cut
	if len(msgs) != 0 {
		t.Fatalf("a cut long pull on an empty queue got %d jobs (%v)", len(msgs), err)
	}
	id := b.publish(&queue.Job{Queue: "q"}).ID // on the same connection: after the pull's end
	msgs, err = other.consumer("q").Fetch(b.ctx, 1, 3*time.Second)
	if err != nil || len(msgs) != 1 || msgs[0].Job.ID != id {
		t.Fatalf("the other process's fetch: %d jobs, %v (the cut pull took the job)", len(msgs), err)
	}
	if msgs[0].Delivered != 1 {
		t.Fatalf("delivered %d times, want 1", msgs[0].Delivered)
	}
	if err := msgs[0].Ack(b.ctx); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkFetch measures a fetch of the jobs available now on an empty queue (the server's
// 404), and a fetch and ack of one stored job (its publish untimed but in cpu-µs/op), per
// operation; cpu-µs/op is client and embedded server together (reportCPU).
func BenchmarkFetch(b *testing.B) {
	bn := setup(b, queue.Options{}, queue.Spec{Name: "q"})
	c := bn.consumer("q")
	b.Run("empty-nowait", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime())
		for b.Loop() {
			if msgs, err := c.Fetch(bn.ctx, 1, 0); err != nil || len(msgs) != 0 {
				b.Fatalf("%d jobs, %v", len(msgs), err)
			}
		}
	})
	b.Run("one-job", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b, cpuTime())
		for b.Loop() {
			b.StopTimer()
			bn.publish(&queue.Job{Queue: "q"})
			b.StartTimer()
			msgs, err := c.Fetch(bn.ctx, 1, time.Second)
			if err != nil || len(msgs) != 1 {
				b.Fatalf("%d jobs, %v", len(msgs), err)
			}
			if err := msgs[0].AckNoWait(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// spent is how many attempts a worker counts as spent on job m before this delivery, as
// internal/worker's recallState counts them: its record's attempts, plus one per delivery
// after the one that wrote the record (m.Delivered above the record's Delivered + 1), which
// left none.
func spent(t *testing.T, b *bundle, m *queue.Msg) int {
	t.Helper()
	st, err := b.q.Record(b.ctx, m.Job.ID)
	if err != nil && !errors.Is(err, queue.ErrNotFound) {
		t.Fatal(err)
	}
	n := st.Attempts
	if seen := st.Delivered + 1; m.Delivered > seen {
		n += int(m.Delivered - seen)
	}
	return n
}

// A late job NAK'd after its hold was never tried: its record says so before the NAK, so that
// the redelivery counts no attempt for it, and a job of max attempts N still gets N deliveries
// tried (here each one fails, records its attempt and NAKs, as a worker does), whether the
// late delivery was its first or came after a try. Before, the NAK'd delivery counted as one
// attempt: N-1 tries.
func TestFetchLateNakSpendsNoAttempt(t *testing.T) {
	for _, before := range []int{0, 1} {
		t.Run(fmt.Sprintf("after %d tries", before), func(t *testing.T) { lateNakTries(t, before) })
	}
}

// lateNakTries tries a job of max attempts 3 before times, makes its next delivery late (the
// server's answer held 1.5 s behind a proxy, its hold 300 ms), and then tries it until its
// attempts are spent, in another process, as a worker would.
func lateNakTries(t *testing.T, before int) {
	srv := testenv.NATS(t)
	p := newStallProxy(t, srv.URL)
	spec := queue.Spec{Name: "q", AckWait: 30 * time.Second}
	b := setupURL(t, "nats://"+p.addr, queue.Options{}, spec)
	other := setupURL(t, srv.URL, queue.Options{Prefix: b.prefix}, spec)
	queue.SetLateHold(b.q, 300*time.Millisecond)
	const maxAttempts = 3
	b.publish(&queue.Job{Queue: "q"})
	c := other.consumer("q")
	tried, late := 0, uint64(0)
	// try fetches the job in the other process and, unless its attempts are spent, fails an
	// attempt: records it and NAKs (confirmed, so the job is ready for the next fetch).
	try := func() bool {
		got := fetchAll(t, other, c, nil, 1, 5*time.Second)
		if len(got) != 1 {
			t.Fatalf("the job not redelivered within 5 s after %d tries", tried)
		}
		m := got[0]
		if late > 0 && m.Delivered != late+1 {
			t.Fatalf("after the late delivery %d: delivered %d times, want %d", late, m.Delivered, late+1)
		}
		late = 0
		attempts := spent(t, other, m)
		if attempts >= maxAttempts {
			if err := m.Ack(other.ctx); err != nil { // dead-lettered, as a worker would
				t.Fatal(err)
			}
			return false
		}
		tried++
		if err := other.q.SetStatus(other.ctx, queue.Status{ID: m.Job.ID, State: queue.StateRetrying,
			Attempts: attempts + 1, Delivered: m.Delivered, LastError: "503"}); err != nil {
			t.Fatal(err)
		}
		if err := m.Nak(other.ctx); err != nil {
			t.Fatal(err)
		}
		return true
	}
	for range before {
		try()
	}
	p.delay.Store(int64(1500 * time.Millisecond))
	got, err := b.consumer("q").Fetch(b.ctx, 1, 0)
	p.delay.Store(0)
	if err != nil || len(got) != 0 { // it gives up after 1 s
		t.Fatalf("a no-wait fetch under a 1.5 s stall got %d jobs, %v", len(got), err)
	}
	late = uint64(before) + 1
	for try() {
	}
	if tried != maxAttempts {
		t.Fatalf("the job was tried %d times, want max attempts %d (the late delivery NAK'd spent one)", tried, maxAttempts)
	}
}
