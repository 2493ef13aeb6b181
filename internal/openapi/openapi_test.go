package openapi_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/sluice-rl/sluice/internal/openapi"
	"github.com/sluice-rl/sluice/internal/openapi/openapitest"
)

// Both documents are valid OpenAPI 3.1 documents, as kin-openapi reads them.
func TestDocumentsAreValid(t *testing.T) {
	if _, err := openapitest.New(nil); err != nil {
		t.Fatal(err)
	}
	for name, doc := range map[string][]byte{"job": openapi.Job(), "admin": openapi.Admin()} {
		var d struct{ OpenAPI string }
		if err := json.Unmarshal(doc, &d); err != nil || d.OpenAPI != "3.1.0" {
			t.Errorf("%s: openapi %q (%v), want 3.1.0", name, d.OpenAPI, err)
		}
	}
}

// Prune keeps the operations the routes serve (a subtree route keeps those under it) and
// nothing else; Undescribed names the routes with no operation.
func TestPruneAndUndescribed(t *testing.T) {
	pruned, err := openapi.Prune(openapi.Admin(), []string{"GET /healthz", "GET /ui/", "POST /v1/queues/{queue}/pause"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := openapi.Operations(pruned)
	want := []string{"GET /healthz", "GET /ui/", "GET /ui/{file}", "POST /v1/queues/{queue}/pause"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("pruned operations %v (%v), want %v", got, err, want)
	}
	var d struct{ Components map[string]json.RawMessage }
	if err := json.Unmarshal(pruned, &d); err != nil || d.Components["schemas"] == nil {
		t.Errorf("pruned document lost its components (%v)", err)
	}
	missing, err := openapi.Undescribed(openapi.Admin(), []string{"GET /healthz", "PUT /healthz", "GET /v1/nope", "GET /ui/"})
	if err != nil || !slices.Equal(missing, []string{"PUT /healthz", "GET /v1/nope"}) {
		t.Errorf("Undescribed: %v (%v), want [PUT /healthz GET /v1/nope]", missing, err)
	}
}
