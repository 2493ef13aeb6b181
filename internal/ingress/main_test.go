package ingress

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-rl/sluice/internal/openapi/openapitest"
)

// api validates the job API's exchanges of the tests (fixture.do) against its OpenAPI
// document; the forwarded paths are not the document's and pass untouched.
var api *openapitest.Validator

// TestMain fails the package's tests if an exchange of the job API is off its OpenAPI
// document, or if they leave goroutines behind: abandoned store calls, proxy connections,
// servers.
func TestMain(m *testing.M) {
	api = openapitest.Install()
	code := api.Finish(m.Run())
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
