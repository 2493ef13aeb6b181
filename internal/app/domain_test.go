package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
	"github.com/sluice-rl/sluice/queue"
)

// TestProcessesThroughDomain: an ingress and a worker connected to a leaf node whose own
// JetStream is in domain leaf, with nats.jetstream_domain: hub, keep the queues in the hub's
// JetStream and work there: jobs are accepted (202), delivered to the upstream and succeed,
// a scheduled job waits and succeeds, an operator's cancel, a dead letter and a fair queue's
// tenant_max_depth (the ledger's holds, and their releases once the jobs end) all go through
// the domain. The NATS user is granted what queue.PermissionsFor a context in domain hub says,
// and nothing on "$JS.API.>": without the key both processes stop at start naming
// "$JS.API.INFO"; with the key but a user granted queue.PermissionsFix they stop naming
// "$JS.hub.API.INFO" and the fix for the domain.
func TestProcessesThroughDomain(t *testing.T) {
	fix := permissionsForDomain(t, "hub")
	conf := filepath.Join(t.TempDir(), "leaf.conf")
	if err := os.WriteFile(conf, []byte(`authorization { users = [
  { user: admin, password: admin }
  { user: plain, password: p, `+queue.PermissionsFix+` }
  { user: domain, password: p, `+fix+` }
] }
no_auth_user: admin
`), 0o644); err != nil {
		t.Fatal(err)
	}
	hub, leaf := testenv.NATSDomains(t, "hub", "leaf", func(o *server.Options) {
		if err := o.ProcessConfigFile(conf); err != nil {
			t.Fatalf("the leaf's users: %v", err)
		}
	})
	rdb := testenv.Redis(t)
	up := workertest.NewRecorder(t)
	release := make(chan struct{}) // the fair queue's deliveries wait for it
	up.Respond(func(a workertest.Arrival, _ int) workertest.Reply {
		switch {
		case strings.HasPrefix(a.URI, "/dead"):
			return workertest.Reply{Status: http.StatusBadRequest}
		case strings.HasPrefix(a.URI, "/fair"):
			return workertest.Reply{Block: release}
		}
		return workertest.Reply{}
	})
	dir := t.TempDir()
	// config is the ingress's config (the worker's: its own admin_listen, no listen) as user,
	// with nats.jetstream_domain: domain unless it is empty.
	config := func(user, domain string) (ingress, worker string) {
		key := ""
		if domain != "" {
			key = ", jetstream_domain: " + domain
		}
		common := fmt.Sprintf(`upstream: %s
redis: { url: %s }
nats: { url: %q%s }
shutdown_timeout: 2s
queues:
  - { name: plain, rate: 100/s, target: POST %s/plain }
  - { name: dead, rate: 100/s, max_attempts: 1, target: POST %s/dead }
  - { name: fair, rate: 100/s, fair: true, tenant: "header:X-Tenant", tenant_max_depth: 2, target: POST %s/fair }
`, up.URL, rdb.URL(), strings.Replace(leaf.URL, "nats://", "nats://"+user+":p@", 1), key, up.URL, up.URL, up.URL)
		return fmt.Sprintf("listen: %s\nadmin_listen: %s\n%s", freeAddr(t), freeAddr(t), common),
			fmt.Sprintf("admin_listen: %s\n%s", freeAddr(t), common)
	}

	// What each process says at start without the key, or with a user not granted the domain.
	for _, c := range []struct{ user, domain, refused, fix string }{
		{"domain", "", `refused Publish to "$JS.API.INFO"`, queue.PermissionsFix},
		{"plain", "hub", `refused Publish to "$JS.hub.API.INFO"`, fix},
	} {
		path := filepath.Join(dir, c.user+c.domain+".yaml")
		cfg, _ := config(c.user, c.domain)
		if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		for proc, run := range map[string]func(context.Context) error{
			"ingress": Ingress{ConfigPath: path, Logger: testLogger()}.Run,
			"worker":  Worker{ConfigPath: path, Logger: testLogger()}.Run,
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := run(ctx)
			late := ctx.Err() != nil
			cancel()
			if late || !errors.Is(err, connect.ErrConfig) || !strings.Contains(err.Error(), c.refused) ||
				!strings.Contains(err.Error(), c.fix) {
				t.Fatalf("%s as %s, domain %q: %v (still running after 10s: %v); want a config error naming %s and the fix %s",
					proc, c.user, c.domain, err, late, c.refused, c.fix)
			}
		}
	}

	// The key set, as a user granted the domain's subjects.
	icfg, wcfg := config("domain", "hub")
	in := start(t, dir, icfg)
	runWorker(t, dir, wcfg)
	waitReady(t, in)
	plain := make([]string, 0, 5)
	for range 5 {
		plain = append(plain, domainPost(t, in, "plain", http.StatusAccepted))
	}
	scheduled := domainPost(t, in, "plain", http.StatusAccepted, "Sluice-Delay", "1s")
	canceled := domainPost(t, in, "plain", http.StatusAccepted, "Sluice-Delay", "1h")
	dead := domainPost(t, in, "dead", http.StatusAccepted)
	for _, id := range plain {
		waitJobState(t, in.listen, id, "succeeded", 15*time.Second)
	}
	if got := domainDelete(t, in, canceled); got != http.StatusOK {
		t.Fatalf("DELETE /v1/jobs/%s on the admin listener: %d, want 200", canceled, got)
	}
	waitJobState(t, in.listen, canceled, "canceled", 15*time.Second)
	waitJobState(t, in.listen, dead, "failed", 15*time.Second)
	var dl struct {
		DeadLetters []struct{ ID string } `json:"dead_letters"`
	}
	domainGet(t, "http://"+in.admin+"/v1/queues/dead/dead-letters", &dl)
	if len(dl.DeadLetters) != 1 || dl.DeadLetters[0].ID != dead {
		t.Fatalf("dead letters of queue dead: %+v, want %s", dl.DeadLetters, dead)
	}
	waitJobState(t, in.listen, scheduled, "succeeded", 15*time.Second)

	// tenant_max_depth 2: the ledger holds tenant a's two jobs while the upstream holds their
	// deliveries, refuses a third, and releases their places once they succeed.
	fair := []string{domainPost(t, in, "fair", http.StatusAccepted, "X-Tenant", "a"),
		domainPost(t, in, "fair", http.StatusAccepted, "X-Tenant", "a")}
	up.WaitCount(t, 10*time.Second, "both of tenant a's jobs delivered", func(int) bool {
		per := up.PerID()
		return per[fair[0]] == 1 && per[fair[1]] == 1
	})
	domainPost(t, in, "fair", http.StatusTooManyRequests, "X-Tenant", "a")
	domainPost(t, in, "fair", http.StatusAccepted, "X-Tenant", "b")
	close(release)
	for _, id := range fair {
		waitJobState(t, in.admin, id, "succeeded", 15*time.Second) // the operator's view: any tenant's job
	}
	testenv.WaitFor(t, 10*time.Second, "tenant a's places released", func() bool {
		return domainTry(t, in, "fair", "X-Tenant", "a") == http.StatusAccepted
	})
	per := up.PerID()
	for _, id := range append(plain, scheduled, fair[0], fair[1]) {
		if per[id] != 1 {
			t.Errorf("job %s reached the upstream %d times, want once", id, per[id])
		}
	}
	if per[canceled] != 0 {
		t.Errorf("the canceled job reached the upstream %d times, want never", per[canceled])
	}

	// The queues are the hub's: the leaf's own JetStream holds none of Sluice's streams.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hubJS, err := jetstream.New(testenv.Connect(t, hub.URL))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{jobStream("plain"), "KV_SLUICE_STATUS"} {
		if _, err := hubJS.Stream(ctx, name); err != nil {
			t.Errorf("the hub's stream %s: %v", name, err)
		}
	}
	leafJS, err := jetstream.New(testenv.Connect(t, leaf.URL))
	if err != nil {
		t.Fatal(err)
	}
	for name := range leafJS.StreamNames(ctx).Name() {
		t.Errorf("the leaf's JetStream holds stream %s, want none", name)
	}
}

// permissionsForDomain is queue.PermissionsFor a JetStream context in domain.
func permissionsForDomain(t *testing.T, domain string) string {
	t.Helper()
	js, err := connect.JetStream(testenv.Connect(t, testenv.NATS(t).URL), domain)
	if err != nil {
		t.Fatal(err)
	}
	return queue.PermissionsFor(js)
}

// domainTry POSTs a job to queue q of r with headers (name, value pairs) and returns the status.
func domainTry(t *testing.T, r *running, q string, hdrs ...string) int {
	t.Helper()
	code, _ := submit(t, r, "/v1/queues/"+q+"/jobs", []byte(`{"x":1}`), hdrs...)
	return code
}

// domainPost POSTs a job to queue q of r, fails the test unless it is answered want, and
// returns the job's id (from its Location) when it is accepted.
func domainPost(t *testing.T, r *running, q string, want int, hdrs ...string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.listen+"/v1/queues/"+q+"/jobs", strings.NewReader(`{"x":1}`))
	for i := 0; i+1 < len(hdrs); i += 2 {
		req.Header.Set(hdrs[i], hdrs[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		t.Fatalf("POST to queue %s %v: %d %s, want %d", q, hdrs, resp.StatusCode, body, want)
	}
	return strings.TrimPrefix(resp.Header.Get("Location"), "/v1/jobs/")
}

// domainDelete cancels job id on r's admin listener and returns the status.
func domainDelete(t *testing.T, r *running, id string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, "http://"+r.admin+"/v1/jobs/"+id, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// domainGet decodes the JSON answer of a GET of url into v.
func domainGet(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestIngressThroughLeafWithoutJetStream: an ingress connected to a leaf node without
// JetStream of its own, whose hub keeps its JetStream in domain hub, and without
// nats.jetstream_domain, reaches no JetStream ("$JS.API.>" does not cross to another domain):
// it answers jobs 503, and /readyz says why and names the key. With the key it accepts them.
func TestIngressThroughLeafWithoutJetStream(t *testing.T) {
	_, leaf := testenv.NATSDomains(t, "hub", "leaf", func(o *server.Options) {
		o.JetStream, o.JetStreamDomain = false, ""
	})
	rdb := testenv.Redis(t)
	config := func(key string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
redis: { url: %s }
nats: { url: %q%s }
shutdown_timeout: 2s
queues:
  - { name: plain, rate: 100/s, target: POST http://127.0.0.1:1/plain }
`, freeAddr(t), freeAddr(t), rdb.URL(), leaf.URL, key)
	}
	in := start(t, t.TempDir(), config(""))
	var why string
	testenv.WaitFor(t, 10*time.Second, "/readyz to name nats.jetstream_domain", func() bool {
		code, failed := readyz(t, in.admin)
		why = failed
		return code == http.StatusServiceUnavailable && strings.Contains(failed, "jetstream not enabled") &&
			strings.Contains(failed, "set nats.jetstream_domain")
	})
	t.Logf("without the key, /readyz: %s", why)
	domainPost(t, in, "plain", http.StatusServiceUnavailable)

	in = start(t, t.TempDir(), config(", jetstream_domain: hub"))
	waitReady(t, in)
	domainPost(t, in, "plain", http.StatusAccepted)
}

// explainOpen names nats.jetstream_domain, and retries, when the server answers that JetStream
// is not enabled (for the account): what a leaf node without JetStream of its own says.
func TestExplainOpenNamesJetStreamDomain(t *testing.T) {
	cfg := &config.Config{Path: "sluice.yaml", NATS: &config.NATS{URL: "nats://leaf:4222"}}
	for _, cause := range []error{jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount} {
		err, permanent := explainOpen(cfg, fmt.Errorf("queue: status bucket SLUICE_STATUS: %w", cause))
		if permanent || !errors.Is(err, cause) || !strings.Contains(err.Error(), "set nats.jetstream_domain") {
			t.Errorf("explainOpen(%v) = %v, permanent %v; want it retried, naming nats.jetstream_domain", cause, err, permanent)
		}
	}
}
