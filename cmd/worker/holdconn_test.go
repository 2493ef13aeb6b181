package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// A fresh worker on a backlog stored while no worker ran: its admission tickets wait
// undelivered in the ledger's hold consumer, and the worker's subscription to the holds
// receives all of them at once (the catch-up). The catch-up goes to a connection of the
// worker's own for the holds, not to the one it fetches, records and acknowledges on, where
// every reply waited behind it; and releases by acknowledgement still find their tickets
// delivered: every job delivered once, every ticket released, none by the fallback deletion.
func TestHoldCatchUpOnItsOwnConnection(t *testing.T) {
	const jobs = 3000
	mon := testenv.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	c := &cluster{t: t, ctx: ctx, redis: testenv.Redis(t),
		nats: testenv.NATSProcIn(t, t.TempDir(), "-m", strconv.Itoa(mon)),
		up:   workertest.NewRecorder(t), dir: t.TempDir()}
	js, err := jetstream.New(testenv.Connect(t, c.nats.URL))
	if err != nil {
		t.Fatal(err)
	}
	if c.qs, err = queue.New(ctx, js, queue.Options{}); err != nil {
		t.Fatal(err)
	}
	path := c.config(c.queueYAML("held", "1000000/s", "concurrency: 16", "max_depth: 100000"))
	workertest.Publish(t, c.qs, "held", jobs, true) // the test's Queues opens no consumer
	monURL := fmt.Sprintf("http://127.0.0.1:%d", mon)
	hold := func() ledgerState { return readLedger(t, monURL, "SLUICE_L_held") }
	if s := hold(); s.msgs != jobs || s.delivered != 0 {
		t.Fatalf("before any worker: ledger holds %d tickets, %d delivered to its hold; want %d, 0", s.msgs, s.delivered, jobs)
	}

	start := time.Now()
	w := spawn(t, path)
	c.up.WaitCount(t, time.Minute, "every job", func(n int) bool { return n >= jobs })
	as := c.up.Arrivals()
	testenv.WaitFor(t, 30*time.Second, "every ticket released", func() bool { return hold().msgs == 0 })
	t.Logf("%d jobs: first at the upstream %v after the worker's start, the last %v after the first",
		jobs, as[0].At.Sub(start).Round(time.Millisecond), as[len(as)-1].At.Sub(as[0].At).Round(time.Millisecond))
	if n := c.up.Distinct(); n != jobs || len(as) != jobs {
		t.Errorf("%d arrivals of %d jobs; want each of %d once", len(as), n, jobs)
	}
	if v, ok := metricValue(w.metrics(), "sluice_ticket_release_fallbacks_total"); !ok || v != 0 {
		t.Errorf("sluice_ticket_release_fallbacks_total %v (exposed %v); want 0: every release found its ticket delivered", v, ok)
	}

	// Where the catch-up went: the server's own count of messages sent per connection.
	var connz struct {
		Connections []struct {
			Name    string `json:"name"`
			OutMsgs int64  `json:"out_msgs"`
			Subs    []struct {
				Subject string `json:"subject"`
			} `json:"subscriptions_list_detail"`
		} `json:"connections"`
	}
	getJSON(t, monURL+"/connz?subs=detail&limit=1000", &connz)
	var holds, main int
	for _, cn := range connz.Connections {
		subscribed := false
		for _, s := range cn.Subs {
			subscribed = subscribed || s.Subject == "SLUICE.hold"
		}
		switch cn.Name {
		case "sluice-worker":
			main++
			if subscribed {
				t.Errorf("the worker's connection subscribes to SLUICE.hold: the catch-up's %d tickets came in ahead of its replies", jobs)
			}
		case "sluice-worker holds":
			holds++
			if !subscribed || cn.OutMsgs < jobs {
				t.Errorf("the holds' connection: subscribed %v, %d messages received; want true, at least %d (the catch-up)", subscribed, cn.OutMsgs, jobs)
			}
		}
	}
	if main != 1 || holds != 1 {
		t.Errorf("the worker has %d connections named sluice-worker and %d named \"sluice-worker holds\"; want 1 and 1", main, holds)
	}
}

// ledgerState is what nats-server's monitoring says of a ledger: tickets stored, and how many
// its hold consumer has delivered.
type ledgerState struct{ msgs, delivered uint64 }

// readLedger reads ledger stream's state from the monitoring endpoint at monURL.
func readLedger(t *testing.T, monURL, stream string) ledgerState {
	t.Helper()
	var jsz struct {
		Accounts []struct {
			Streams []struct {
				Name  string `json:"name"`
				State struct {
					Msgs uint64 `json:"messages"`
				} `json:"state"`
				Consumers []struct {
					Name      string `json:"name"`
					Delivered struct {
						Stream uint64 `json:"stream_seq"`
					} `json:"delivered"`
				} `json:"consumer_detail"`
			} `json:"stream_detail"`
		} `json:"account_details"`
	}
	getJSON(t, monURL+"/jsz?consumers=true", &jsz)
	var s ledgerState
	for _, a := range jsz.Accounts {
		for _, st := range a.Streams {
			if st.Name != stream {
				continue
			}
			s.msgs = st.State.Msgs
			for _, cn := range st.Consumers {
				if cn.Name == "hold" {
					s.delivered = cn.Delivered.Stream
				}
			}
		}
	}
	return s
}

// getJSON GETs url and decodes its JSON answer into v.
func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
