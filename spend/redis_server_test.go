package spend

import (
	"testing"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// startRedisServer starts a private redis-server (internal/redistest), with
// an append-only file fsynced on every write when persist is set, so that a
// killed server comes back with its data as a durable production Redis
// would. It fails, never skips, without redis-server: CI installs it.
func startRedisServer(t testing.TB, persist bool) *redistest.Server {
	t.Helper()
	if persist {
		return redistest.Start(t, redistest.Persistent())
	}
	return redistest.Start(t)
}
