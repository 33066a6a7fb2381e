package redistest

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash
// tag (the text between its first '{' and the next '}', when not empty),
// else of the whole key, modulo 16384.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slots
}

// ScriptRun is one script call (EVAL or EVALSHA) as a node's MONITOR showed
// it: the keys it declared and the keys its commands named. Every command
// the tollgate scripts issue names one key, its first argument, or none
// (TIME).
type ScriptRun struct {
	Node     string
	Declared []string
	Touched  []string
}

// CrossSlot returns the keys r touched outside the slot of its first
// declared key (all of them when it declared none).
func (r ScriptRun) CrossSlot() []string {
	var out []string
	for _, k := range r.Touched {
		if len(r.Declared) == 0 || Slot(k) != Slot(r.Declared[0]) {
			out = append(out, k)
		}
	}
	return out
}

// MonitorScripts records, through MONITOR on every live master, the
// scripts they run from now on, until stop is called; stop returns them.
// Redis 7.0 lets a script without flags reach any key its node holds, of
// any slot, so a test that wants to know whether a script stays in one slot
// has to look.
func (c *Cluster) MonitorScripts(t testing.TB) (stop func() []ScriptRun) {
	t.Helper()
	var masters []*Server
	err := c.withLive(func(_ context.Context, _ *Server, _ *redis.Client, view []clusterNode) error {
		for _, v := range view {
			if v.is("master") && !v.failing() && len(v.slots) > 0 {
				masters = append(masters, c.Node(v.addr))
			}
		}
		return nil
	}, true)
	if err != nil {
		t.Fatalf("monitor: %v", err)
	}
	mons := make([]*monitor, len(masters))
	for i, m := range masters {
		mons[i] = startMonitor(t, m.Addr())
	}
	return func() []ScriptRun {
		t.Helper()
		var runs []ScriptRun
		for _, m := range mons {
			runs = append(runs, m.stop(t)...)
		}
		return runs
	}
}

// monitor is a MONITOR connection to one node and the lines it read.
type monitor struct {
	addr  string
	conn  net.Conn
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func startMonitor(t testing.TB, addr string) *monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m := &monitor{addr: addr, conn: conn, done: make(chan struct{})}
	t.Cleanup(func() { _ = conn.Close(); <-m.done })
	rd := bufio.NewReader(conn)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := rd.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR on %s: %q, %v", addr, line, err)
	}
	_ = conn.SetDeadline(time.Time{})
	go func() {
		defer close(m.done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(strings.TrimPrefix(line, "+"), "\r\n")
			m.mu.Lock()
			m.lines = append(m.lines, line)
			m.mu.Unlock()
		}
	}()
	return m
}

// stop makes sure that every command the node ran before it was called has
// been read (an ECHO of a marker, waited for), closes the connection and
// parses what it read.
func (m *monitor) stop(t testing.TB) []ScriptRun {
	t.Helper()
	marker := "monitor-stop-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	cl := redis.NewClient(&redis.Options{Addr: m.addr, MaxRetries: -1})
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.Echo(ctx, marker).Err(); err != nil {
		t.Fatalf("monitor of %s: %v", m.addr, err)
	}
	// Bounded: 2000 × 5 ms.
	for i := 0; !m.has(marker); i++ {
		if i == 2000 {
			t.Fatalf("monitor of %s: its marker never came", m.addr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = m.conn.Close()
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	runs, err := parseMonitor(m.addr, m.lines)
	if err != nil {
		t.Fatal(err)
	}
	return runs
}

// has reports whether a line read holds marker.
func (m *monitor) has(marker string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.lines) - 1; i >= 0; i-- {
		if strings.Contains(m.lines[i], marker) {
			return true
		}
	}
	return false
}

// parseMonitor groups MONITOR lines ("<time> [<db> <client>] "<arg>" ...")
// into script runs: Redis shows a script call, then each command the script
// issued, from client "lua".
func parseMonitor(node string, lines []string) ([]ScriptRun, error) {
	var runs []ScriptRun
	var cur *ScriptRun
	for _, line := range lines {
		_, rest, ok := strings.Cut(line, " [")
		if !ok {
			return nil, fmt.Errorf("MONITOR line %q", line)
		}
		client, rest, ok := strings.Cut(rest, "] ")
		if !ok {
			return nil, fmt.Errorf("MONITOR line %q", line)
		}
		args, err := monitorArgs(rest)
		if err != nil || len(args) == 0 {
			return nil, fmt.Errorf("MONITOR line %q: %v", line, err)
		}
		name := strings.ToLower(args[0])
		switch {
		case strings.HasSuffix(client, " lua"):
			if cur == nil {
				return nil, fmt.Errorf("MONITOR: a script's command without its script: %q", line)
			}
			if len(args) > 1 && name != "time" {
				cur.Touched = append(cur.Touched, args[1])
			}
		case name == "eval" || name == "evalsha":
			if len(args) < 3 {
				return nil, fmt.Errorf("MONITOR: %q", line)
			}
			n, err := strconv.Atoi(args[2])
			if err != nil || n < 0 || 3+n > len(args) {
				return nil, fmt.Errorf("MONITOR: bad key count in %q", line)
			}
			runs = append(runs, ScriptRun{Node: node, Declared: args[3 : 3+n]})
			cur = &runs[len(runs)-1]
		default:
			cur = nil
		}
	}
	return runs, nil
}

// monitorArgs splits MONITOR's quoted arguments, undoing Redis's escapes
// (sdscatrepr: \\ \" \n \r \t \a \b and \xHH).
func monitorArgs(s string) ([]string, error) {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimLeft(s, " ") {
		if s[0] != '"' {
			return nil, fmt.Errorf("argument not quoted at %q", s)
		}
		var b strings.Builder
		i := 1
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] != '\\' || i+1 == len(s) {
				b.WriteByte(s[i])
				continue
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				if i+2 >= len(s) {
					return nil, fmt.Errorf("short \\x escape in %q", s)
				}
				v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					return nil, err
				}
				b.WriteByte(byte(v))
				i += 2
			default:
				b.WriteByte(s[i])
			}
		}
		if i == len(s) {
			return nil, fmt.Errorf("unterminated argument in %q", s)
		}
		out = append(out, b.String())
		s = s[i+1:]
	}
	return out, nil
}
