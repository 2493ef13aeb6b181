package ingress

import (
	"encoding/json"
	"io"
	"testing"

	"github.com/sluice-rl/sluice/internal/openapi"
)

// Every route of the job API is described in its OpenAPI document, and the public listener
// serves that document at /openapi.json (under the rules that match it, not forwarded).
func TestOpenAPIDescribesRoutes(t *testing.T) {
	f := newFixture(t, "rules: []\n", Options{})
	routes := f.srv.Routes()
	if len(routes) < 3 {
		t.Fatalf("Routes %v: too few to be the job API's", routes)
	}
	missing, err := openapi.Undescribed(openapi.Job(), routes)
	if err != nil || len(missing) > 0 {
		t.Errorf("routes not described in the job API's OpenAPI document: %v (%v)", missing, err)
	}
	res := f.do("GET", "/openapi.json", nil)
	body, _ := io.ReadAll(res.Body)
	var doc struct{ OpenAPI string }
	if err := json.Unmarshal(body, &doc); res.StatusCode != 200 || err != nil || doc.OpenAPI != "3.1.0" {
		t.Fatalf("GET /openapi.json: %d %.200s (%v)", res.StatusCode, body, err)
	}
	if string(body) != string(openapi.Job()) {
		t.Errorf("GET /openapi.json is not the job API's document")
	}
}
