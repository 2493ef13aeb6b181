// Command jspub turns each request into a JetStream message as bare as JetStream allows: it
// reads the body, publishes it asynchronously to a file-backed stream and, once the PubAck is
// in, answers 202 with a fixed JSON body. No rule, no job envelope, no headers: the ceiling of
// any net/http server that acknowledges a request only after JetStream stored it.
// scripts/bench-peers.sh runs it beside the ingress's defer path.
//
// With -per-job, each message goes to a subject of its own and carries a Nats-Msg-Id, as a
// Sluice job does (its status is read from its subject, and its id is deduplicated): what those
// two cost in the server, apart from everything else the ingress does. -expect-stream and
// -work-queue add the rest of what a Sluice queue asks of the server for each message: a
// Nats-Expected-Stream header, and work-queue retention with a durable consumer.
//
// With -tickets N (1 or 2; implies -per-job), each request first stores N admission tickets,
// published together and awaited together, one per ticket stream of its own (work-queue
// retention, DiscardNew, a bound that is never reached; the second with a per-subject bound,
// DiscardNewPerSubject), each under the job's Nats-Msg-Id, and only then the job: what the
// admission ledger asks of the server for a rule's deferral (2: the queue's ticket and the
// rule's deferral budget's) or a direct submission (1), without anything else Sluice does.
// Its rate is the ceiling of the exact ledger as built on this machine
// (docs/design/queue.md, "The defer path's ceiling").
package main

import (
	"context"
	"flag"
	"io"
	"log"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:19330", "address to serve on")
	url := flag.String("nats", nats.DefaultURL, "NATS server URL")
	perJob := flag.Bool("per-job", false, "a subject and a Nats-Msg-Id per message")
	expect := flag.Bool("expect-stream", false, "a Nats-Expected-Stream header on each message, as Sluice sends")
	workQueue := flag.Bool("work-queue", false, "work-queue retention with a durable pull consumer, as a Sluice queue has")
	tickets := flag.Int("tickets", 0, "admission tickets stored before each job, 0 to 2 (implies -per-job)")
	flag.Parse()
	if *tickets < 0 || *tickets > 2 {
		log.Fatalf("-tickets %d: want 0, 1 or 2", *tickets)
	}
	if *tickets > 0 {
		*perJob = true
	}

	nc, err := nats.Connect(*url)
	if err != nil {
		log.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	name := "JSPUB"
	if *perJob {
		name = "JSPUB_PERJOB"
	}
	if *tickets > 0 {
		name += "_T" + strconv.Itoa(*tickets)
	}
	ctx := context.Background()
	name = jobStream(ctx, js, name, *workQueue)
	ticketSubjects := ticketStreams(ctx, js, name, *tickets)

	var n atomic.Uint64
	body := []byte(`{"id":"0","state":"queued"}` + "\n")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		m := &nats.Msg{Subject: name + ".jobs", Data: data}
		if *perJob {
			id := strconv.FormatUint(n.Add(1), 36) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			m.Subject = name + ".jobs." + id
			m.Header = nats.Header{jetstream.MsgIDHeader: []string{id}}
		}
		if len(ticketSubjects) > 0 {
			if status, err := storeTickets(js, ticketSubjects, m.Header.Get(jetstream.MsgIDHeader)); err != nil {
				http.Error(w, err.Error(), status)
				return
			}
		}
		if *expect {
			if m.Header == nil {
				m.Header = nats.Header{}
			}
			m.Header[jetstream.ExpectedStreamHeader] = []string{name}
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		select {
		case <-f.Ok():
		case err := <-f.Err():
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header()["Content-Type"] = []string{"application/json"}
		w.WriteHeader(http.StatusAccepted)
		w.Write(body)
	})
	log.Fatal(http.ListenAndServe(*listen, h))
}

// ticketStreams makes the ticket streams: the queue's ledger (one subject: one tenant) and a
// deferral budget's (one subject: one key), bounds far above what a run stores. It returns
// the subject to store each stream's tickets on.
func ticketStreams(ctx context.Context, js jetstream.JetStream, name string, tickets int) []string {
	var subjects []string
	for i := range tickets {
		tcfg := jetstream.StreamConfig{
			Name: name + "_L" + strconv.Itoa(i), Retention: jetstream.WorkQueuePolicy,
			Discard: jetstream.DiscardNew, MaxMsgs: 1e9, Storage: jetstream.FileStorage,
		}
		if i == 1 {
			tcfg.MaxMsgs, tcfg.MaxMsgsPerSubject, tcfg.DiscardNewPerSubject = -1, 1e9, true
		}
		tcfg.Subjects = []string{tcfg.Name + ".*"}
		if _, err := js.CreateOrUpdateStream(ctx, tcfg); err != nil {
			log.Fatal(err)
		}
		subjects = append(subjects, tcfg.Name+".t")
	}
	return subjects
}

// storeTickets stores a ticket of job id on each of subjects, published together and awaited
// together. On failure it returns the status to answer: 503 when a publish could not be sent,
// 429 when the server refused a ticket.
func storeTickets(js jetstream.JetStream, subjects []string, id string) (int, error) {
	fs := make([]jetstream.PubAckFuture, len(subjects))
	for i, subj := range subjects {
		t := &nats.Msg{Subject: subj, Data: []byte(id), Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
		f, err := js.PublishMsgAsync(t)
		if err != nil {
			return http.StatusServiceUnavailable, err
		}
		fs[i] = f
	}
	for _, f := range fs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return http.StatusTooManyRequests, err
		}
	}
	return 0, nil
}

// jobStream makes the jobs' stream, name (with workQueue, name_WQ: work-queue retention and a
// durable pull consumer, as a Sluice queue has), and returns its name.
func jobStream(ctx context.Context, js jetstream.JetStream, name string, workQueue bool) string {
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}
	if workQueue {
		cfg.Name += "_WQ"
		cfg.Subjects = []string{cfg.Name + ".>"}
		cfg.Retention = jetstream.WorkQueuePolicy
	}
	if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	if workQueue {
		if _, err := js.CreateOrUpdateConsumer(ctx, cfg.Name, jetstream.ConsumerConfig{
			Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
		}); err != nil {
			log.Fatal(err)
		}
	}
	return cfg.Name
}
