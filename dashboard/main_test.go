package dashboard_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a goroutine behind: the
// gateway, limiter and ledger the browser test starts must all stop.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
