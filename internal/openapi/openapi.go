// Package openapi holds the OpenAPI 3.1 documents of Sluice's HTTP API and serves them at
// GET /openapi.json:
//
//	job.json    the job API of the public listener (listen): submit a job, read its status
//	admin.json  the admin listener (admin_listen): probes, metrics, queue state, the
//	            operating API and the dashboard
//
// Each listener serves its own document, because the two listeners answer the same path
// differently (GET /v1/jobs/{id} is tenant-scoped on listen and the operator's view on
// admin_listen; /v1/queues/{queue}/jobs is a POST on one and a GET on the other). An admin
// listener serves the admin document pruned to the operations it has mounted ([Prune]): a
// worker's lists its probes, /metrics and /openapi.json only.
//
// The documents are the contract the process tests hold the servers to: every request they
// send and every answer they get is validated against them (internal/openapi/openapitest),
// every documented operation is exercised, and every route the servers register is
// documented ([Undescribed]). Edit the JSON by hand; keep it to what the code does.
//
// Costs: the documents are embedded (about 80 KB); serving one is a write of a byte slice,
// pruning happens once per admin server.
package openapi

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
)

var (
	//go:embed job.json
	job []byte
	//go:embed admin.json
	admin []byte
)

// Job returns the document of the job API (the public listener). The caller must not modify it.
func Job() []byte { return job }

// Admin returns the document of the admin listener, with every operation an ingress mounts.
// The caller must not modify it.
func Admin() []byte { return admin }

// Handler serves doc as application/json.
func Handler(doc []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "no-store")
		w.Write(doc)
	})
}

// methods are the operation keys of a path item.
var methods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

// Operations lists doc's operations as "METHOD /path" (the method in upper case, the path as
// the document writes it), sorted.
func Operations(doc []byte) ([]string, error) {
	paths, err := pathsOf(doc)
	if err != nil {
		return nil, err
	}
	var ops []string
	for p, item := range paths {
		for m := range item {
			if slices.Contains(methods, m) {
				ops = append(ops, strings.ToUpper(m)+" "+p)
			}
		}
	}
	slices.Sort(ops)
	return ops, nil
}

// Undescribed returns the routes ("METHOD /path", the path with {name} parameters, as
// http.ServeMux patterns write them) that doc has no operation for. A GET route is described
// by a GET operation; HEAD, which the servers answer with GET's handler, needs none.
func Undescribed(doc []byte, routes []string) ([]string, error) {
	ops, err := Operations(doc)
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, r := range routes {
		if !slices.Contains(ops, r) {
			missing = append(missing, r)
		}
	}
	return missing, nil
}

// Prune returns doc with only the operations that routes serve: a route "GET /p" keeps the
// operation GET /p, and a route whose path ends in "/" (a ServeMux subtree) also keeps the
// operations of the method under it. Paths left with no operation are removed; components are
// kept.
func Prune(doc []byte, routes []string) ([]byte, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(doc, &top); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	paths, err := pathsOf(doc)
	if err != nil {
		return nil, err
	}
	kept := map[string]map[string]json.RawMessage{}
	for p, item := range paths {
		out := map[string]json.RawMessage{}
		for k, v := range item {
			if !slices.Contains(methods, k) {
				continue
			}
			if slices.ContainsFunc(routes, func(r string) bool { return serves(r, strings.ToUpper(k), p) }) {
				out[k] = v
			}
		}
		if len(out) == 0 {
			continue
		}
		for k, v := range item {
			if !slices.Contains(methods, k) {
				out[k] = v // summary, parameters, servers of the path
			}
		}
		kept[p] = out
	}
	if top["paths"], err = json.Marshal(kept); err != nil {
		return nil, err
	}
	return json.MarshalIndent(top, "", "  ")
}

// serves reports whether route ("METHOD /pattern") serves method on path.
func serves(route, method, path string) bool {
	m, pattern, ok := strings.Cut(route, " ")
	if !ok || m != method {
		return false
	}
	return pattern == path || strings.HasSuffix(pattern, "/") && strings.HasPrefix(path, pattern)
}

func pathsOf(doc []byte) (map[string]map[string]json.RawMessage, error) {
	var d struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	return d.Paths, nil
}
