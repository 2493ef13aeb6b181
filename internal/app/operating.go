package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/admin"
	"github.com/sluice-rl/sluice/internal/worker"
	"github.com/sluice-rl/sluice/queue"
)

// presenceValue is a worker's entry in the presence bucket. Workers before it wrote the queue
// names joined by commas, which readWorkers still reads.
type presenceValue struct {
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	Queues  []string  `json:"queues"`
	// Answers are the worker's delivery attempts per queue since Started (worker.Answers),
	// for the ingress's history; absent from workers before them.
	Answers map[string]presenceAnswers `json:"answers,omitempty"`
}

// presenceAnswers is a queue's worker.Answers in a presence entry, kept small (about 20 bytes
// plus the non-zero time-in-queue buckets): tiq's trailing empty buckets are left off.
type presenceAnswers struct {
	N    uint64   `json:"n"`
	R429 uint64   `json:"r429,omitempty"`
	R5xx uint64   `json:"r5xx,omitempty"`
	TIQ  []uint64 `json:"tiq,omitempty"`
}

// announcement is the presence entry of this process, draining queues, having made the
// attempts answers (nil: none counted).
func announcement(host string, started time.Time, queues []string, answers map[string]worker.Answers) []byte {
	v := presenceValue{Host: host, PID: os.Getpid(), Version: version(), Started: started, Queues: queues}
	if answers != nil {
		v.Answers = make(map[string]presenceAnswers, len(answers))
		for q, a := range answers {
			tiq := a.TimeInQueue[:]
			for len(tiq) > 0 && tiq[len(tiq)-1] == 0 {
				tiq = tiq[:len(tiq)-1]
			}
			v.Answers[q] = presenceAnswers{N: a.Delivered, R429: a.R429, R5xx: a.R5xx, TIQ: tiq}
		}
	}
	b, _ := json.Marshal(v)
	return b
}

// adminAnswers are a presence entry's answers as the history reads them; nil for none.
func adminAnswers(in map[string]presenceAnswers) map[string]admin.Answers {
	if in == nil {
		return nil
	}
	out := make(map[string]admin.Answers, len(in))
	for q, a := range in {
		out[q] = admin.Answers{Delivered: a.N, R429: a.R429, R5xx: a.R5xx, TimeInQueue: a.TIQ}
	}
	return out
}

// poolAnswers are pool's answers as the history reads them; nil for a nil pool.
func poolAnswers(pool *worker.Pool) map[string]admin.Answers {
	if pool == nil {
		return nil
	}
	out := map[string]admin.Answers{}
	for q, a := range pool.Answers() {
		out[q] = admin.Answers{Delivered: a.Delivered, R429: a.R429, R5xx: a.R5xx, TimeInQueue: a.TimeInQueue[:]}
	}
	return out
}

// processStarted is when this process started, the Started of its in-process pool.
var processStarted = time.Now().UTC()

// version is this binary's module version and VCS revision, as the Go toolchain recorded them.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
	}
	return v
}

// readWorkers reads every worker's current entry in the presence bucket kv of js.
//
// A watcher's initial values are not a snapshot: its end marker comes after as many messages
// as the bucket held when the watch began, and a key rewritten meanwhile (each worker rewrites
// its own every presenceEvery) can come twice before the marker while another key comes only
// after it. So the entries are kept by key, the latest revision of each, and the keys the
// bucket holds once the marker is in (its stream's subjects) that the watch has not delivered
// are read one by one: a worker present throughout is never missed nor counted twice. Costs:
// one watch, one stream info listing the keys, and one get per key rewritten during the read
// (usually none). The entries come in the order they were written.
func readWorkers(ctx context.Context, js jetstream.JetStream, kv jetstream.KeyValue) ([]admin.Worker, error) {
	latest := map[string]jetstream.KeyValueEntry{} // deletes too: a key deleted since is not read
	keep := func(e jetstream.KeyValueEntry) {
		if prev, ok := latest[e.Key()]; !ok || e.Revision() > prev.Revision() {
			latest[e.Key()] = e
		}
	}
	if err := initialValues(ctx, kv, keep); err != nil {
		return nil, err
	}
	keys, err := bucketKeys(ctx, js, kv.Bucket())
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if _, ok := latest[k]; ok {
			continue
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // deleted or expired since the listing
		}
		if err != nil {
			return nil, err
		}
		keep(e)
	}
	entries := make([]jetstream.KeyValueEntry, 0, len(latest))
	for _, e := range latest {
		if e.Operation() == jetstream.KeyValuePut {
			entries = append(entries, e)
		}
	}
	slices.SortFunc(entries, func(a, b jetstream.KeyValueEntry) int { return cmp.Compare(a.Revision(), b.Revision()) })
	out := make([]admin.Worker, 0, len(entries))
	for _, e := range entries {
		out = append(out, parsePresence(e.Key(), e.Value(), e.Created()))
	}
	return out, nil
}

// initialValues passes keep the entries of kv (deletes too) that a watcher delivers up to its
// end of initial values, then stops the watcher.
func initialValues(ctx context.Context, kv jetstream.KeyValue, keep func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer stopWatch(ctx, w)
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil // the end of the initial values, as far as the watcher counts
			}
			keep(e)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stopWatch stops w and takes what it still delivers until it closes its channel (or ctx
// ends): a watcher's delivery blocks, holding its goroutine, on a full channel (256 entries,
// which a busy bucket fills within a read) that nobody reads any more.
func stopWatch(ctx context.Context, w jetstream.KeyWatcher) {
	_ = w.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// bucketKeys lists the keys key-value bucket holds a message for (a value or a delete
// marker), from its stream's subjects: one request, the server's state at one instant.
func bucketKeys(ctx context.Context, js jetstream.JetStream, bucket string) ([]string, error) {
	st, err := js.Stream(ctx, "KV_"+bucket)
	if err != nil {
		return nil, err
	}
	prefix := "$KV." + bucket + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subj, prefix))
	}
	return keys, nil
}

// parsePresence reads a presence entry: JSON, or the older comma-separated queue names.
func parsePresence(key string, val []byte, seen time.Time) admin.Worker {
	w := admin.Worker{ID: key, LastSeen: seen.UTC()}
	var v presenceValue
	if len(val) > 0 && val[0] == '{' && json.Unmarshal(val, &v) == nil {
		w.Host, w.PID, w.Version, w.Started, w.Queues = v.Host, v.PID, v.Version, v.Started, v.Queues
		w.Answers = adminAnswers(v.Answers)
	} else if len(val) > 0 {
		w.Queues = strings.Split(string(val), ",")
	}
	if w.Queues == nil {
		w.Queues = []string{}
	}
	return w
}

// workers lists the worker processes for GET /v1/health: the presence bucket's, or the
// quickstart's in-process pool.
func (p *ingressProc) workers(ctx context.Context) ([]admin.Worker, error) {
	if p.current.Load().NATS == nil {
		host, _ := os.Hostname()
		return []admin.Worker{{ID: "in-process", Host: host, PID: os.Getpid(), Version: version(),
			Queues: queueNames(p.current.Load()), LastSeen: time.Now().UTC(), Started: processStarted,
			Answers: poolAnswers(p.pooled.Load())}}, nil
	}
	if p.late.qs.Load() == nil {
		return nil, errors.New("the queues are not open yet")
	}
	return presentWorkers(ctx, p.js)
}

// presentWorkers reads every worker's entry in js's presence bucket; none while it does not exist.
func presentWorkers(ctx context.Context, js jetstream.JetStream) ([]admin.Worker, error) {
	kv, err := js.KeyValue(ctx, presenceBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return []admin.Worker{}, nil
	}
	if err != nil {
		return nil, err
	}
	return readWorkers(ctx, js, kv)
}

// counts reads every queue's stream counters at once, for the history.
func (p *ingressProc) counts(ctx context.Context) (map[string]queue.Counts, error) {
	qs := p.late.qs.Load()
	if qs == nil {
		return nil, errors.New("the queues are not open yet")
	}
	fair := false
	for _, q := range p.current.Load().Queues {
		fair = fair || q.Fair
	}
	return qs.Counts(ctx, fair)
}

// mountOperating mounts the history, health and job browser of the admin API, and registers
// sluice_queue_desired_workers, whose worker counts are sluice_queue_consumers' (cm).
func (p *ingressProc) mountOperating(queues *admin.Queues, cm *consumersMetric) {
	p.history = &admin.History{Queues: queues, Counts: p.counts, Workers: p.workers,
		TimeInQueueBounds: worker.TimeInQueueBounds[:]}
	p.history.Mount(p.adm)
	(&admin.Health{Server: p.adm, Queues: queues, Workers: p.workers}).Mount(p.adm)
	(&admin.Jobs{Q: p.late, Queues: queues}).Mount(p.adm)
	p.reg.MustRegister(p.history.DesiredMetric(cm.counts))
}
