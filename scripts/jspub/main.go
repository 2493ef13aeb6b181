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
	flag.Parse()

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
	ctx := context.Background()
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage}
	if *workQueue {
		cfg.Name += "_WQ"
		cfg.Subjects = []string{cfg.Name + ".>"}
		cfg.Retention = jetstream.WorkQueuePolicy
		name = cfg.Name
	}
	if _, err := js.CreateOrUpdateStream(ctx, cfg); err != nil {
		log.Fatal(err)
	}
	if *workQueue {
		if _, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
			Durable: "workers", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: -1,
		}); err != nil {
			log.Fatal(err)
		}
	}

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
