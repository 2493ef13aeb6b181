// Command nowaitstall shows what becomes of the jobs of a no-wait fetch whose answer reaches the
// client late (docs/design/start-window.md, "A fetch's jobs stranded for an AckWait"). It
// connects to a NATS server through a TCP proxy of its own, makes a stream and a durable pull
// consumer (AckWait 30 s, as a queue's default ack_wait), stores -jobs messages, and has the
// proxy hold the server's bytes for -hold while it calls FetchNoWait(-jobs), as
// queue.Consumer.Fetch does for the jobs available now. It prints what the fetch returned, the
// consumer's acks pending afterwards and what a second no-wait fetch gets, then deletes its
// stream. nats.go stops waiting for a no-wait fetch's answer after 1 s without a message and
// reports an empty batch without an error: with -hold over 1 s, the jobs the server had sent
// stay pending, held by no one, until their AckWait.
//
//	go run ./scripts/nowaitstall -nats nats://127.0.0.1:4222 -hold 1.5s
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	url := flag.String("nats", "127.0.0.1:4222", "the NATS server's `host:port` (nats:// allowed)")
	hold := flag.Duration("hold", 1500*time.Millisecond, "how long the proxy holds the fetch's answer")
	jobs := flag.Int("jobs", 16, "messages stored, and the fetch's batch")
	flag.Parse()
	if err := run(*url, *hold, *jobs); err != nil {
		fmt.Fprintln(os.Stderr, "nowaitstall:", err)
		os.Exit(1)
	}
}

func run(server string, hold time.Duration, jobs int) error {
	if u, ok := cutScheme(server); ok {
		server = u
	}
	var delay atomic.Int64
	addr, err := proxy(server, &delay)
	if err != nil {
		return err
	}
	nc, err := nats.Connect("nats://" + addr)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	name := fmt.Sprintf("NOWAITSTALL_%d", os.Getpid())
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}})
	if err != nil {
		return err
	}
	defer js.DeleteStream(ctx, name)
	c, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second})
	if err != nil {
		return err
	}
	for range jobs {
		if _, err := js.Publish(ctx, name+".job", []byte("x")); err != nil {
			return err
		}
	}
	delay.Store(int64(hold))
	t0 := time.Now()
	got, err := fetchNoWait(c, jobs)
	if err != nil {
		return err
	}
	fmt.Printf("answer held %v: FetchNoWait(%d) returned %d messages after %v\n", hold, jobs, got, time.Since(t0).Round(time.Millisecond))
	delay.Store(0)
	time.Sleep(hold + 300*time.Millisecond) // the held bytes pass
	info, err := c.Info(ctx)
	if err != nil {
		return err
	}
	again, err := fetchNoWait(c, jobs)
	if err != nil {
		return err
	}
	fmt.Printf("then: %d acks pending (the fetch's messages not received: %d), %d not yet delivered; a second FetchNoWait gets %d\n",
		info.NumAckPending, info.NumAckPending-got, info.NumPending, again)
	return nil
}

// fetchNoWait returns how many messages a FetchNoWait(n) received, and the batch's error.
func fetchNoWait(c jetstream.Consumer, n int) (int, error) {
	b, err := c.FetchNoWait(n)
	if err != nil {
		return 0, err
	}
	got := 0
	for range b.Messages() {
		got++
	}
	return got, b.Error()
}

func cutScheme(u string) (string, bool) {
	const p = "nats://"
	if len(u) > len(p) && u[:len(p)] == p {
		return u[len(p):], true
	}
	return u, false
}

// proxy passes TCP between a local listener and server, holding each chunk the server sends
// for delay (ns) first.
func proxy(server string, delay *atomic.Int64) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
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
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						time.Sleep(time.Duration(delay.Load()))
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), nil
}
