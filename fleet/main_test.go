package fleet

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if a test leaves a heartbeat goroutine or a
// Redis client behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
