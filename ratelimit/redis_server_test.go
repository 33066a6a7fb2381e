package ratelimit

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a private redis-server on a free loopback port, so tests
// never touch a developer's Redis (unlike redis_rate's tests on :6379).
type redisServer struct {
	t    testing.TB
	port int
	cmd  *exec.Cmd
}

// startRedis starts a redis-server for the test and returns a client to it;
// both are stopped in t.Cleanup.
func startRedis(t testing.TB) *redis.Client {
	t.Helper()
	srv := startRedisServer(t)
	return srv.client(t)
}

// startRedisServer starts a redis-server on a free port. It fails the test
// when redis-server is not on PATH: these tests are the proof that limits
// are shared, so they must not silently skip (CI installs it with apt-get).
func startRedisServer(t testing.TB) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found on PATH (apt-get install redis-server): %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	srv := &redisServer{t: t, port: port}
	srv.start()
	t.Cleanup(srv.kill)
	return srv
}

func (s *redisServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

func (s *redisServer) start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	// Bounded wait for the server to accept commands: 500 × 10 ms.
	var err error
	for range 500 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.kill()
	s.t.Fatalf("redis-server on %s did not answer PING: %v", s.addr(), err)
}

// kill stops the server, losing its data (it never persists).
func (s *redisServer) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// restart kills the server and starts an empty one on the same port, as a
// crashed Redis coming back would.
func (s *redisServer) restart() {
	s.t.Helper()
	s.kill()
	s.start()
}

// client returns a new client of the server, closed in t.Cleanup.
func (s *redisServer) client(t testing.TB, hooks ...redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.addr()})
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
