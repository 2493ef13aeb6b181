package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/app"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// ingress runs the one-process ingress (embedded NATS, in-process workers) with cfg, and
// returns its public and admin addresses.
func ingress(t *testing.T, cfg string) (listen, admin string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	cfg = strings.ReplaceAll(cfg, "DATA", filepath.Join(dir, "data"))
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- app.Ingress{ConfigPath: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready: func(l, a string) { listen, admin = l, a; close(ready) }}.Run(ctx)
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("ingress: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	validator.Serve(t, "job", listen)
	validator.Serve(t, "admin", admin)
	return listen, admin
}

// sluice runs the CLI with args against admin and returns its exit status, stdout and stderr.
func sluice(admin string, env map[string]string, args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	getenv := func(k string) string {
		if k == "SLUICE_ADMIN_URL" {
			return "http://" + admin
		}
		return env[k]
	}
	code := run(context.Background(), args, getenv, &out, &errOut)
	return code, out.String(), errOut.String()
}

func submit(t *testing.T, listen, q, body string) string {
	t.Helper()
	resp, err := http.Post("http://"+listen+"/v1/queues/"+q+"/jobs", "text/plain", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("submit: %d %s", resp.StatusCode, b)
	}
	return strings.TrimPrefix(resp.Header.Get("Location"), "/v1/jobs/")
}

// TestOperatingThroughTheCLI drives every row of the operating API through the CLI against a
// real ingress: pause stops deliveries and resume restarts them; a runtime rate shows and
// clears; a canceled job is never delivered; a dead letter is listed, replayed and delivered,
// and purged.
func TestOperatingThroughTheCLI(t *testing.T) {
	rec := workertest.NewRecorder(t)
	rec.Respond(func(a workertest.Arrival, nth int) workertest.Reply {
		if strings.HasPrefix(string(a.Body), "poison") && nth == 1 {
			return workertest.Reply{Status: http.StatusBadRequest} // dead-lettered at once
		}
		return workertest.Reply{}
	})
	listen, admin := ingress(t, fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
data_dir: DATA
queues:
  - { name: ops, rate: 50/s, target: "POST %s/ops" }
  - { name: fairops, rate: 1/h, tenant: "header:X-Tenant", fair: true, weights: { gold: 2 }, tenant_settings: { gold: { label: gold-co } }, target: "POST %s/fair" }
`, rec.URL, rec.URL))

	code, out, _ := sluice(admin, nil, "queues")
	if code != 0 || !strings.Contains(out, "QUEUE") || !strings.Contains(out, "ops") || !strings.Contains(out, "50/s") {
		t.Fatalf("queues: %d\n%s", code, out)
	}

	// Pause: nothing is delivered while paused; resume delivers.
	if code, out, errOut := sluice(admin, nil, "pause", "ops"); code != 0 || !strings.Contains(out, "yes") {
		t.Fatalf("pause: %d %s %s", code, out, errOut)
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, submit(t, listen, "ops", fmt.Sprint("job ", i)))
	}
	canceled := submit(t, listen, "ops", "to cancel")
	if code, out, errOut := sluice(admin, nil, "job", "cancel", canceled); code != 0 || !strings.Contains(out, "canceled") {
		t.Fatalf("job cancel: %d %s %s", code, out, errOut)
	}
	// A second's worth of the 50/s rate goes by without a delivery.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if n := rec.Count(); n != 0 {
			t.Fatalf("%d deliveries while the queue is paused", n)
		}
		time.Sleep(50 * time.Millisecond) // sampling a property over a span, not waiting for an event
	}
	var q struct {
		Paused        bool    `json:"paused"`
		EffectiveRate float64 `json:"effective_rate"`
		RuntimeRate   *string `json:"runtime_rate"`
	}
	_, out, _ = sluice(admin, nil, "queue", "ops", "--json") // global options anywhere

	if err := json.Unmarshal([]byte(out), &q); err != nil || !q.Paused || q.EffectiveRate != 0 {
		t.Fatalf("queue --json while paused: %+v %v\n%s", q, err, out)
	}
	if code, _, errOut := sluice(admin, nil, "resume", "ops"); code != 0 {
		t.Fatalf("resume: %d %s", code, errOut)
	}
	testenv.WaitFor(t, 10*time.Second, "the paused jobs delivered", func() bool {
		per := rec.PerID()
		for _, id := range ids {
			if per[id] == 0 {
				return false
			}
		}
		return true
	})
	if rec.PerID()[canceled] != 0 {
		t.Fatal("the canceled job was delivered")
	}

	// Runtime rate.
	if code, out, errOut := sluice(admin, nil, "rate", "ops", "40/s"); code != 0 || !strings.Contains(out, "40/s (runtime)") {
		t.Fatalf("rate: %d %s %s", code, out, errOut)
	}
	_, out, _ = sluice(admin, nil, "queue", "ops", "--json") // global options anywhere

	if err := json.Unmarshal([]byte(out), &q); err != nil || q.RuntimeRate == nil || *q.RuntimeRate != "40/s" || q.EffectiveRate != 40 {
		t.Fatalf("queue after rate 40/s: %+v\n%s", q, out)
	}
	if code, _, _ := sluice(admin, nil, "rate", "ops", "file"); code != 0 {
		t.Fatal("rate ops file failed")
	}
	_, out, _ = sluice(admin, nil, "queue", "ops", "--json") // global options anywhere

	if q.RuntimeRate = nil; json.Unmarshal([]byte(out), &q) != nil || q.RuntimeRate != nil {
		t.Fatalf("queue after rate file: %s", out)
	}

	// Dead letters: list, replay (delivered the second time), purge.
	poison := submit(t, listen, "ops", "poison 1")
	testenv.WaitFor(t, 10*time.Second, "the poison job dead-lettered", func() bool {
		_, out, _ := sluice(admin, nil, "dlq", "list", "ops")
		return strings.Contains(out, poison)
	})
	if code, out, errOut := sluice(admin, nil, "dlq", "replay", "ops", poison); code != 0 || !strings.Contains(out, "replayed 1") {
		t.Fatalf("dlq replay: %d %s %s", code, out, errOut)
	}
	testenv.WaitFor(t, 10*time.Second, "the replayed job delivered again", func() bool { return rec.PerID()[poison] >= 2 })
	poison2 := submit(t, listen, "ops", "poison 2")
	testenv.WaitFor(t, 10*time.Second, "the second poison job dead-lettered", func() bool {
		_, out, _ := sluice(admin, nil, "dlq", "list", "ops")
		return strings.Contains(out, poison2)
	})
	if code, out, _ := sluice(admin, nil, "dlq", "purge", "ops"); code != 0 || !strings.Contains(out, "purged 1") {
		t.Fatalf("dlq purge: %d %s", code, out)
	}
	if _, out, _ := sluice(admin, nil, "dlq", "list", "ops"); !strings.Contains(out, "no dead letters") {
		t.Fatalf("dlq list after purge:\n%s", out)
	}

	// A fair queue: its tenants, and one of them by value.
	for range 3 {
		req, _ := http.NewRequest(http.MethodPost, "http://"+listen+"/v1/queues/fairops/jobs", strings.NewReader("x"))
		req.Header.Set("X-Tenant", "gold")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit to fairops: %v %v", resp, err)
		}
		resp.Body.Close()
	}
	if code, out, errOut := sluice(admin, nil, "queue", "fairops"); code != 0 || !strings.Contains(out, "TENANTS") ||
		!strings.Contains(out, "TENANT ") || !strings.Contains(out, "gold-co") {
		t.Fatalf("queue fairops: %d %s %s", code, out, errOut)
	}
	if code, out, errOut := sluice(admin, nil, "tenant", "fairops", "gold"); code != 0 || !strings.Contains(out, "DELIVERED") ||
		!strings.Contains(out, "gold-co") || !strings.Contains(out, "  2  ") {
		t.Fatalf("tenant fairops gold: %d %s %s", code, out, errOut)
	}

	// Errors: one line, exit 1.
	code, _, errOut := sluice(admin, nil, "queue", "nope")
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "404") {
		t.Fatalf("queue nope: %d %q", code, errOut)
	}
}

// TestAdminToken: with admin_token set, a write without the token is refused (401, exit 1) and
// changes nothing; with it, it goes through. Reads stay open.
func TestAdminToken(t *testing.T) {
	_, admin := ingress(t, `listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
admin_token: s3cret-admin-token
data_dir: DATA
queues:
  - { name: guarded, rate: 5/s, target: "POST http://127.0.0.1:1/x" }
`)
	code, _, errOut := sluice(admin, nil, "pause", "guarded")
	if code != 1 || !strings.Contains(errOut, "401") || !strings.Contains(errOut, "SLUICE_ADMIN_TOKEN") {
		t.Fatalf("pause without a token: %d %q", code, errOut)
	}
	if code, out, _ := sluice(admin, nil, "queue", "guarded"); code != 0 || !strings.Contains(out, "no") {
		t.Fatalf("queue read without a token: %d %s", code, out)
	}
	env := map[string]string{"SLUICE_ADMIN_TOKEN": "s3cret-admin-token"}
	if code, out, errOut := sluice(admin, env, "pause", "guarded"); code != 0 || !strings.Contains(out, "yes") {
		t.Fatalf("pause with the token: %d %s %s", code, out, errOut)
	}
	if code, _, _ := sluice(admin, nil, "--token", "wrong", "resume", "guarded"); code != 1 {
		t.Fatal("resume with a wrong token succeeded")
	}
}
