// Command jsdrain drains one Sluice queue as bare as JetStream allows: it fetches jobs through
// the queue package, POSTs each job's body to a target URL and acks it without waiting
// (queue.Msg.AckNoWait), with a fixed number of jobs in hand. No leak slot, no status record,
// no retries: the ceiling of any worker that takes its jobs from JetStream and delivers them
// over HTTP. With -record it also records each job's outcome in Sluice's status bucket before
// the ack, as a Sluice worker does for its job API: the ceiling of a worker that keeps that
// promise. scripts/bench-peers.sh runs four of these beside Sluice's workers and BullMQ's.
//
// It connects, prints "ready" on stdout and waits for SIGUSR1 before it takes the first job, so
// that several processes start draining together.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/queue"
)

func main() {
	path := flag.String("config", "", "the Sluice config `file` that defines the queue")
	name := flag.String("queue", "", "the `queue` to drain")
	target := flag.String("target", "", "the `URL` each job's body is POSTed to")
	concurrency := flag.Int("c", 16, "jobs in hand at once")
	record := flag.Bool("record", false, "record each job's outcome (queue.Queues.SetStatus) before acking it")
	flag.Parse()

	cfg, err := config.Load(*path)
	if err != nil {
		log.Fatal(err)
	}
	nc, err := nats.Connect(cfg.NATS.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	qs, err := queue.New(ctx, js, app.QueueOptions(cfg)) // the same streams as the workers: shared or own
	if err != nil {
		log.Fatal(err)
	}
	if err := qs.Provision(ctx, app.QueueSpecs(cfg)); err != nil {
		log.Fatal(err)
	}
	cons, err := qs.Consumer(ctx, *name)
	if err != nil {
		log.Fatal(err)
	}

	start := make(chan os.Signal, 1)
	signal.Notify(start, syscall.SIGUSR1)
	fmt.Println("ready")
	<-start

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *concurrency}, Timeout: 10 * time.Second}
	free := make(chan struct{}, *concurrency) // a token per job that may be taken
	for range *concurrency {
		free <- struct{}{}
	}
	for {
		<-free
		n := 1
		for len(free) > 0 && n < *concurrency { // take as many as there is room for
			<-free
			n++
		}
		msgs := fetch(ctx, cons, n)
		for range n - len(msgs) {
			free <- struct{}{}
		}
		for _, m := range msgs {
			go func() {
				defer func() { free <- struct{}{} }()
				req, err := http.NewRequest(http.MethodPost, *target, bytes.NewReader(m.Job.Body))
				if err != nil {
					log.Fatal(err)
				}
				req.Header.Set("Idempotency-Key", m.Job.ID) // as a Sluice worker and bullmq.mjs send
				resp, err := client.Do(req)
				if err != nil {
					log.Print(err)
					return // redelivered after AckWait
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if *record {
					err := qs.SetStatus(ctx, queue.Status{ID: m.Job.ID, Queue: *name, State: queue.StateSucceeded,
						Attempts: 1, Delivered: m.Delivered, CreatedAt: m.Job.CreatedAt, Response: &queue.Response{Status: resp.StatusCode}})
					if err != nil {
						log.Print(err)
					}
				}
				if err := m.AckNoWait(); err != nil {
					log.Print(err)
				}
			}()
		}
	}
}

// fetch takes up to n jobs: what is there now and, only when nothing is, waits for the next
// (a Fetch of n with a wait holds the last few jobs of a backlog until n arrive or the wait
// ends).
func fetch(ctx context.Context, cons *queue.Consumer, n int) []*queue.Msg {
	msgs, err := cons.Fetch(ctx, n, 0)
	if err == nil && len(msgs) == 0 {
		msgs, err = cons.Fetch(ctx, 1, time.Second)
	}
	if err != nil {
		log.Fatal(err)
	}
	return msgs
}
