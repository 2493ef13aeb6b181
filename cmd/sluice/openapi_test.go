package main

import (
	"os"
	"testing"

	"github.com/sluice-rl/sluice/internal/openapi/openapitest"
)

// validator validates every request the CLI and the tests send to a test's ingress (through
// http.DefaultClient, which the CLI uses), and every answer, against the OpenAPI documents.
var validator *openapitest.Validator

func TestMain(m *testing.M) {
	validator = openapitest.Install()
	os.Exit(validator.Finish(m.Run()))
}
