package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/worker"
)

// Worker presence: JetStream knows one durable consumer per queue, shared by every worker, and
// its pull requests (NumWaiting) come and go with each fetch: it cannot say how many processes
// drain a queue. So each standalone worker says so itself: every presenceEvery it puts a key of
// its own, whose value lists the queues it drains and its delivery attempts per queue by
// answer and time in queue (cumulative since it started, read by the ingress's history), in the key-value bucket presenceBucket, whose
// entries live presenceTTL. A worker that stops deletes its key; one that dies is forgotten
// after presenceTTL. The ingress counts them per queue: sluice_queue_consumers.
const (
	presenceBucket = "SLUICE_WORKERS"
	presenceEvery  = 5 * time.Second
	presenceTTL    = 3 * presenceEvery
)

// presence is the "presence" service of the worker: it runs until ctx ends, then withdraws.
// Its entry carries answers' counts (nil: none), for the ingress's history.
func presence(ctx context.Context, js jetstream.JetStream, current func() *config.Config, answers func() map[string]worker.Answers, log *slog.Logger) error {
	return announce(ctx, js, current, answers, presenceEvery, log)
}

// announce puts this process's presence entry every period until ctx ends, then deletes it.
func announce(ctx context.Context, js jetstream.JetStream, current func() *config.Config, answers func() map[string]worker.Answers, every time.Duration, log *slog.Logger) error {
	host, _ := os.Hostname()
	key := strings.NewReplacer(".", "_", " ", "_").Replace(fmt.Sprintf("%s-%d-%s", host, os.Getpid(), uuid.NewString()[:8]))
	var kv jetstream.KeyValue
	started := time.Now().UTC()
	warned := false
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		cfg := current()
		err := func() error {
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if kv == nil {
				b, err := js.CreateOrUpdateKeyValue(pctx, jetstream.KeyValueConfig{
					Bucket: presenceBucket, TTL: presenceTTL, History: 1, Storage: jetstream.MemoryStorage, Replicas: replicas(cfg),
				})
				if err != nil {
					return err
				}
				kv = b
			}
			var a map[string]worker.Answers
			if answers != nil {
				a = answers()
			}
			_, err := kv.Put(pctx, key, announcement(host, started, queueNames(cfg), a))
			return err
		}()
		if err != nil && ctx.Err() == nil && !warned {
			log.Warn("worker: cannot announce itself in "+presenceBucket+" (sluice_queue_consumers will not count it); retrying", "err", err)
		}
		warned = err != nil
		select {
		case <-ctx.Done():
			if kv != nil {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				_ = kv.Delete(dctx, key)
				cancel()
			}
			return nil
		case <-t.C:
		}
	}
}

// consumersMetric is sluice_queue_consumers{queue}: the worker processes draining each of the
// current config's queues, as they announce themselves (see presence), plus the in-process
// pool of the quickstart. Read at most once a second; nothing while JetStream does not answer.
type consumersMetric struct {
	js        func() jetstream.JetStream // nil until the queues are open
	current   func() *config.Config
	inProcess bool

	mu   sync.Mutex
	at   time.Time
	last map[string]int
	ok   bool
}

var descConsumers = prometheus.NewDesc("sluice_queue_consumers",
	"Worker processes draining the queue (announced every 5s in the "+presenceBucket+" bucket; the quickstart's in-process pool counts 1). 0 with jobs waiting: nothing drains it.",
	[]string{"queue"}, nil)

func (m *consumersMetric) Describe(ch chan<- *prometheus.Desc) { ch <- descConsumers }

func (m *consumersMetric) Collect(ch chan<- prometheus.Metric) {
	counts, ok := m.counts()
	if !ok {
		return
	}
	for _, q := range m.current().Queues {
		ch <- prometheus.MustNewConstMetric(descConsumers, prometheus.GaugeValue, float64(counts[q.Name]), q.Name)
	}
}

// counts returns the announced workers by queue, read at most once a second; false when
// JetStream cannot tell.
func (m *consumersMetric) counts() (map[string]int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Since(m.at) >= time.Second {
		m.last, m.ok = m.read()
		m.at = time.Now()
	}
	return m.last, m.ok
}

// read counts the announced workers by queue; false when JetStream cannot tell.
func (m *consumersMetric) read() (map[string]int, bool) {
	counts := map[string]int{}
	if m.inProcess {
		for _, q := range m.current().Queues {
			counts[q.Name] = 1
		}
		return counts, true
	}
	js := m.js()
	if js == nil {
		return nil, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, presenceBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return counts, true // no worker ever announced itself
	}
	if err != nil {
		return nil, false
	}
	ws, err := readWorkers(ctx, js, kv)
	if err != nil {
		return nil, false
	}
	for _, w := range ws {
		for _, q := range w.Queues {
			counts[q]++
		}
	}
	return counts, true
}
