// Package redistest starts a private, real redis-server for tests (Start),
// or a Redis Cluster of them (StartCluster): on free loopback ports, never a
// developer's own Redis, and never a mock. Tests fail (they do not skip)
// when redis-server or redis-cli is missing: they are the proof that limits
// and spend are shared, and CI installs them with apt-get.
package redistest

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Server is a redis-server child process.
type Server struct {
	t       testing.TB
	port    int
	dir     string // data directory when persistent
	persist bool
	args    []string // more redis-server arguments (a cluster node's)
	cmd     *exec.Cmd
	stalled bool // SIGSTOP sent, no SIGCONT yet
}

// Option configures Start.
type Option func(*Server)

// Persistent makes the server keep its data across Kill and Start: an
// append-only file fsynced after every write, in a directory of the test, as
// a production Redis configured for durability would.
func Persistent() Option { return func(s *Server) { s.persist = true } }

// withArgs adds redis-server arguments.
func withArgs(args ...string) Option { return func(s *Server) { s.args = append(s.args, args...) } }

// Start starts a redis-server on a free port; it is killed in t.Cleanup.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	need(t, "redis-server", "redis-server")
	s := &Server{t: t, port: freePort(t)}
	for _, o := range opts {
		o(s)
	}
	if s.persist {
		s.dir = t.TempDir()
	}
	s.Start()
	t.Cleanup(s.Kill)
	return s
}

// need fails the test when tool is not on PATH, naming the Debian package
// that provides it.
func need(t testing.TB, tool, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(tool); err != nil {
		t.Fatalf("%s not found on PATH (apt-get install %s): %v", tool, pkg, err)
	}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return port
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Start starts the server process (again, after Kill) on the same port and
// waits until it answers PING.
func (s *Server) Start() {
	s.t.Helper()
	args := []string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", ""}
	if s.persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir)
	} else {
		args = append(args, "--appendonly", "no")
	}
	args = append(args, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
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
	s.Kill()
	s.t.Fatalf("redis-server on %s did not answer PING: %v", s.Addr(), err)
}

// Kill stops the server with SIGKILL, as a crash would. A non-persistent
// server loses its data.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.Resume() // a stopped process dies of SIGKILL too, but Wait must not race SIGCONT
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Stall stops the server with SIGSTOP, as a Redis that hangs (a long
// command, a swapped-out host, a network partition) would: connections stay
// open and commands wait unanswered until Resume. Kill and the test's
// cleanup resume it first.
func (s *Server) Stall() {
	s.t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		s.t.Fatal("redistest: Stall of a server that is not running")
	}
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		s.t.Fatalf("redistest: stall: %v", err)
	}
	s.stalled = true
}

// Resume lets a stalled server answer again (SIGCONT).
func (s *Server) Resume() {
	if s.cmd == nil || s.cmd.Process == nil || !s.stalled {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	s.stalled = false
}

// Restart kills the server and starts it again on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.Start()
}

// Client returns a new client of the server, closed in t.Cleanup.
func (s *Server) Client(t testing.TB, hooks ...redis.Hook) *redis.Client {
	return s.ClientWith(t, redis.Options{}, hooks...)
}

// ClientWith is Client with options (Addr is set here).
func (s *Server) ClientWith(t testing.TB, opts redis.Options, hooks ...redis.Hook) *redis.Client {
	opts.Addr = s.Addr()
	if opts.MaintNotificationsConfig == nil { // as the gateway's (govern.go)
		opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	}
	c := redis.NewClient(&opts)
	for _, h := range hooks {
		c.AddHook(h)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
