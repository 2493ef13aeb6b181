package ingress

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if they leave goroutines behind: abandoned store calls,
// proxy connections, servers.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
