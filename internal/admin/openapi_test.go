package admin

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rl/sluice/internal/openapi"
)

// Every route the admin API can mount is described in the admin OpenAPI document, and a
// server's /openapi.json lists exactly the operations it mounted: a worker's (New alone) its
// probes, /metrics and /openapi.json; an ingress's, everything.
func TestOpenAPIDescribesRoutes(t *testing.T) {
	worker := New("127.0.0.1:0", prometheus.NewRegistry())
	full := New("127.0.0.1:0", prometheus.NewRegistry())
	queues := &Queues{}
	queues.Mount(full)
	if err := (&Ops{Queues: queues}).Mount(full, nil); err != nil {
		t.Fatal(err)
	}
	(&History{Queues: queues}).Mount(full)
	(&Health{Server: full, Queues: queues}).Mount(full)
	(&Jobs{Queues: queues}).Mount(full)
	(&Regions{}).Mount(full)

	all, err := openapi.Operations(openapi.Admin())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		s    *Server
		want []string
	}{
		{"worker", worker, []string{"GET /healthz", "GET /metrics", "GET /openapi.json", "GET /readyz"}},
		{"ingress", full, all},
	} {
		missing, err := openapi.Undescribed(openapi.Admin(), c.s.Routes())
		if err != nil || len(missing) > 0 {
			t.Errorf("%s: routes not described in the admin OpenAPI document: %v (%v)", c.name, missing, err)
		}
		res, body := get(t, c.s.Handler(), "/openapi.json")
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("%s: GET /openapi.json: %d %s", c.name, res.StatusCode, res.Header)
		}
		got, err := openapi.Operations(body)
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("%s: /openapi.json lists %v (%v), want %v", c.name, got, err, c.want)
		}
	}
}
