package main

import (
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

// ingressOf runs an ingress in this process with worker config path, on free ports, until the
// test ends; it returns its public address once it defers (its /readyz answers 200).
func (c *cluster) ingressOf(path string) string {
	c.t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		c.t.Fatal(err)
	}
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(c.t))
	admin := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(c.t))
	yaml := strings.Replace(string(b), "admin_listen: 127.0.0.1:1\n", "listen: "+listen+"\nadmin_listen: "+admin+"\n", 1)
	ipath := filepath.Join(c.dir, "ingress.yaml")
	if err := os.WriteFile(ipath, []byte(yaml), 0o644); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() { done <- app.Ingress{ConfigPath: ipath, Logger: logger}.Run(ctx) }()
	c.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			c.t.Errorf("ingress: %v", err)
		}
	})
	testenv.WaitFor(c.t, 30*time.Second, "the ingress to be ready", func() bool {
		select {
		case err := <-done:
			c.t.Fatalf("ingress exited: %v", err)
		default:
		}
		res, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return listen
}

// etaOf reads the eta and id of a job answer (a 202 or a status).
func etaOf(t *testing.T, res *http.Response, want int) (id string, eta time.Time) {
	t.Helper()
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	var v struct {
		ID  string     `json:"id"`
		ETA *time.Time `json:"eta"`
	}
	if res.StatusCode != want || json.Unmarshal(body, &v) != nil || v.ETA == nil {
		t.Fatalf("%d %s: want %d with an eta", res.StatusCode, body, want)
	}
	return v.ID, *v.ETA
}

// TestETAMatchesDelivery: a job submitted behind a 200-job backlog of a 20/s queue, drained
// by a worker process, arrives at the upstream within ±20% of the time its 202's eta gave, and
// its status, read again 60 deliveries later while it waits, tells an eta as close from then.
func TestETAMatchesDelivery(t *testing.T) {
	c := newCluster(t)
	up := startUpstream(t)
	const name, rate, backlog = "eta", 20, 200
	path := c.config(c.queueYAMLTo(up.URL, name, fmt.Sprintf("%d/s", rate)))
	listen := c.ingressOf(path)
	c.spawn(path)
	workertest.Publish(t, c.qs, name, backlog, true)

	accepted := time.Now()
	res, err := http.Post("http://"+listen+"/v1/queues/"+name+"/jobs", "text/plain", strings.NewReader("last"))
	if err != nil {
		t.Fatal(err)
	}
	id, eta := etaOf(t, res, http.StatusAccepted)

	// Once 60 jobs (3s at the rate) have reached the upstream, while it still waits, its
	// status tells the wait from then.
	up.WaitCount(t, time.Minute, "60 deliveries", func(n int) bool { return n >= 60 })
	read := time.Now()
	res, err = http.Get("http://" + listen + "/v1/jobs/" + id)
	if err != nil {
		t.Fatal(err)
	}
	_, later := etaOf(t, res, http.StatusOK)

	var arrived time.Time
	up.WaitCount(t, time.Minute, "the job behind the backlog", func(int) bool {
		for _, a := range up.Arrivals("/q/" + name) {
			if a.ID == id {
				arrived = a.At
				return true
			}
		}
		return false
	})
	delivered := arrived.Sub(accepted)
	t.Logf("202 eta in %v, status eta (60 deliveries later) in %v; delivered in %v (%d jobs at the upstream before it)",
		eta.Sub(accepted).Round(time.Millisecond), later.Sub(read).Round(time.Millisecond),
		delivered.Round(time.Millisecond), len(up.Arrivals("/q/"+name))-1)
	if off := eta.Sub(arrived); off.Abs() > delivered/5 {
		t.Errorf("the 202's eta is %v off the delivery, %v after the 202: more than 20%%", off, delivered)
	}
	if wait, off := arrived.Sub(read), later.Sub(arrived); off.Abs() > wait/5 {
		t.Errorf("the status's eta is %v off the delivery, %v after the read: more than 20%%", off, wait)
	}
}
