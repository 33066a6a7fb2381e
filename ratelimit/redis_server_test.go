package ratelimit

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/internal/redistest"
)

// redisServer is a private redis-server on a free loopback port
// (internal/redistest), so tests never touch a developer's Redis. Tests fail
// rather than skip without redis-server: they are the proof that limits are
// shared, and CI installs it.
type redisServer struct{ *redistest.Server }

// startRedis starts a redis-server for the test and returns a client to it;
// both are stopped in t.Cleanup.
func startRedis(t testing.TB) *redis.Client {
	t.Helper()
	return startRedisServer(t).client(t)
}

func startRedisServer(t testing.TB) *redisServer {
	t.Helper()
	return &redisServer{redistest.Start(t)}
}

// startPersistentRedisServer keeps its data across kill and restart (an
// append-only file fsynced on every write).
func startPersistentRedisServer(t testing.TB) *redisServer {
	t.Helper()
	return &redisServer{redistest.Start(t, redistest.Persistent())}
}

func (s *redisServer) kill()    { s.Kill() }
func (s *redisServer) restart() { s.Restart() }

func (s *redisServer) client(t testing.TB, hooks ...redis.Hook) *redis.Client {
	return s.Client(t, hooks...)
}

func (s *redisServer) clientWith(t testing.TB, opts redis.Options, hooks ...redis.Hook) *redis.Client {
	return s.ClientWith(t, opts, hooks...)
}
