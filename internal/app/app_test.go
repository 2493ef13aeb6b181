package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/config"
	"github.com/sluice-rl/sluice/internal/connect"
	"github.com/sluice-rl/sluice/internal/testenv"
	"github.com/sluice-rl/sluice/internal/worker/workertest"
)

// The example configs in the repository load.
func TestExampleConfigsLoad(t *testing.T) {
	for _, f := range []string{"../../examples/quickstart.yaml", "../../deploy/sluice.yaml", "../../internal/config/testdata/full.yaml"} {
		if _, err := config.Load(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// An invalid config is a connect.ErrConfig (exit status 2) whose message names the file, the rule and
// the field of every problem.
func TestInvalidConfigExits2(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	os.WriteFile(path, []byte(`upstream: http://127.0.0.1:1
rules:
  - name: login
    algorithm: token_bucket
    limit: 5
    period: 0s
  - name: search
    algorithm: nope
    limit: 1
    period: 1s
`), 0o644)
	err := Ingress{ConfigPath: path}.Run(context.Background())
	if connect.ExitCode(err) != 2 {
		t.Fatalf("exit code %d for %v, want 2", connect.ExitCode(err), err)
	}
	for _, want := range []string{`sluice.yaml: rules[0] "login": period must be > 0`, `sluice.yaml: rules[1] "search": algorithm`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

// In embedded mode, jobs accepted before a restart of the ingress are delivered after it: the
// embedded JetStream keeps them under data_dir.
func TestEmbeddedJobsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	rec := workertest.NewRecorder(t)
	delivered := func(ids []string) int {
		n, per := 0, rec.PerID()
		for _, id := range ids {
			if per[id] > 0 {
				n++
			}
		}
		return n
	}

	cfg := func(rate string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
queues:
  - name: slow
    rate: %s
    ack_wait: 1s
    target: POST %s/jobs
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), rate, rec.URL)
	}
	// First run: a queue so slow that nothing is delivered before the restart.
	r := start(t, dir, cfg("1/h"))
	var ids []string
	for i := range 20 {
		resp, err := http.Post("http://"+r.listen+"/v1/queues/slow/jobs", "text/plain", strings.NewReader(fmt.Sprint("job ", i)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("submit: %d", resp.StatusCode)
		}
		loc := resp.Header.Get("Location")
		ids = append(ids, strings.TrimPrefix(loc, "/v1/jobs/"))
	}
	r.stop()
	// At most the one job whose slot came at once was delivered.
	if n := delivered(ids); n > 1 {
		t.Fatalf("%d jobs delivered at 1/h before the restart", n)
	}

	// Second run on the same data_dir, with a fast rate: every job is delivered.
	start(t, dir, cfg("100/s"))
	testenv.WaitFor(t, 20*time.Second, "all 20 jobs delivered after the restart", func() bool {
		return delivered(ids) == len(ids)
	})
}

// A config change on disk is applied without a restart, and an invalid one is refused while the
// old config keeps working.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	// Listening before the first request: one answered 502 would spend the limit's only slot.
	upLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	upAddr := upLn.Addr().String()
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})}
	go up.Serve(upLn)
	t.Cleanup(func() { up.Close() })
	listen, adminAddr := freeAddr(t), freeAddr(t)
	cfg := func(limit string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
upstream: http://%s
rules:
  - name: all
    algorithm: fixed_window
    limit: %s
    period: 1h
`, listen, adminAddr, filepath.Join(dir, "data"), upAddr, limit)
	}
	r := start(t, dir, cfg("1"))
	get := func() int {
		resp, err := http.Get("http://" + r.listen + "/x")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testenv.WaitFor(t, 5*time.Second, "the upstream", func() bool { return get() == 200 })
	if got := get(); got != 429 {
		t.Fatalf("second request under limit 1: %d, want 429", got)
	}
	path := filepath.Join(dir, "sluice.yaml")
	os.WriteFile(path, []byte(cfg("1000")), 0o644)
	testenv.WaitFor(t, 10*time.Second, "the raised limit to apply", func() bool { return get() == 200 })

	os.WriteFile(path, []byte(cfg("-1")), 0o644)
	testenv.WaitFor(t, 10*time.Second, "the invalid reload to be counted", func() bool {
		resp, err := http.Get("http://" + r.admin + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "sluice_config_reload_errors_total 1")
	})
	if got := get(); got != 200 {
		t.Fatalf("after an invalid reload: %d, want 200 under the old limit of 1000", got)
	}
}

// On SIGTERM the one-process quickstart hands the jobs its in-process pool holds back for
// immediate redelivery, as separate worker processes do: after a restart they are delivered at
// once, not after ack_wait (30s here) behind later jobs.
func TestEmbeddedHandsBackHeldJobs(t *testing.T) {
	dir := t.TempDir()
	rec := workertest.NewRecorder(t)
	cfg := func(rate string) string {
		return fmt.Sprintf(`listen: %s
admin_listen: %s
data_dir: %s
queues:
  - name: held
    rate: %s
    ack_wait: 30s
    target: POST %s/jobs
`, freeAddr(t), freeAddr(t), filepath.Join(dir, "data"), rate, rec.URL)
	}
	r := start(t, dir, cfg("1/h"))
	var ids []string
	for i := range 10 {
		resp, err := http.Post("http://"+r.listen+"/v1/queues/held/jobs", "text/plain", strings.NewReader(fmt.Sprint("job ", i)))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		ids = append(ids, strings.TrimPrefix(resp.Header.Get("Location"), "/v1/jobs/"))
	}
	// The pool takes jobs and holds them, waiting for slots an hour apart.
	testenv.WaitFor(t, 10*time.Second, "the first delivery", func() bool { return rec.Count() >= 1 })
	r.stop()
	start(t, dir, cfg("100/s"))
	testenv.WaitFor(t, 10*time.Second, "every job delivered soon after the restart", func() bool {
		per := rec.PerID()
		for _, id := range ids {
			if per[id] == 0 {
				return false
			}
		}
		return true
	})
}
