// Package fleet tells a gateway replica how many replicas share its Redis.
// Each replica writes a heartbeat (its id, scored by Redis's clock, in one
// sorted set) every Interval and reads back how many beat within TTL. The
// count is what a replica's in-process fallback divides the fleet's limits
// by while Redis is down: with Redis gone, the last count read is the best
// knowledge of the fleet there is.
package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultInterval is Options.Interval when it is zero.
const DefaultInterval = time.Second

// Options configure a Fleet.
type Options struct {
	// Prefix starts the fleet's key ("<prefix>fleet"); empty means
	// "tollgate:". It must not contain '{' or '}'.
	Prefix string
	// ID names this replica in the fleet; empty means a random one. It is
	// no secret and no key: a host name or a pod name does.
	ID string
	// Interval is the time between heartbeats; zero means DefaultInterval.
	Interval time.Duration
	// TTL is how long a replica counts as alive after its last heartbeat;
	// zero means three intervals, so that one lost heartbeat drops nobody.
	TTL time.Duration
	// OnLive, if set, is called with the count after every heartbeat that
	// reached Redis (for a gauge). It must be quick.
	OnLive func(n int)
	// Logger receives the changes of the count and the first failure of an
	// outage; nil discards.
	Logger *slog.Logger
}

// Fleet is one replica's membership. Its zero value is not usable; see New.
type Fleet struct {
	client   redis.UniversalClient
	key      string
	id       string
	interval time.Duration
	ttl      time.Duration
	log      *slog.Logger
	onLive   func(int)

	live atomic.Int64 // last count read; 1 until the first heartbeat
	// recent is the largest count the heartbeats read lately (see Recent).
	recent  recentPeak
	beats   atomic.Uint64
	failing atomic.Bool

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// heartbeatScript records ARGV[1] as alive now (Redis's clock, µs), forgets
// the members older than ARGV[2] µs, keeps the set for ARGV[3] ms past the
// last heartbeat and returns how many members are left.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%d', now - tonumber(ARGV[2])))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('ZCARD', KEYS[1])
`)

// New returns a Fleet on client (which it does not own). It beats once
// before returning, so that Live is the fleet's count from the start when
// Redis answers (one round trip, bounded by ctx), then every Interval in a
// goroutine that Close stops.
func New(ctx context.Context, client redis.UniversalClient, o Options) (*Fleet, error) {
	if client == nil {
		return nil, errors.New("fleet: New without a Redis client")
	}
	if o.Prefix == "" {
		o.Prefix = "tollgate:"
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, errors.New("fleet: the prefix must not contain '{' or '}'")
	}
	if o.ID == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		o.ID = hex.EncodeToString(b[:])
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.TTL <= 0 {
		o.TTL = 3 * o.Interval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{
		client: client, key: o.Prefix + "fleet", id: o.ID, interval: o.Interval, ttl: o.TTL,
		log: o.Logger, onLive: o.OnLive, stop: make(chan struct{}), done: make(chan struct{}),
	}
	f.live.Store(1)
	f.beat(ctx)
	go f.loop()
	return f, nil
}

// ID returns this replica's id in the fleet.
func (f *Fleet) ID() string { return f.id }

// Live returns how many replicas beat within TTL at the last heartbeat that
// reached Redis, this one included; 1 if none has.
func (f *Fleet) Live() int { return int(f.live.Load()) }

// Recent returns the largest count read by the heartbeats of the last
// RecentWindow or so (between one and two windows), this replica included;
// Live if larger. After Redis restarted empty or failed over, the first
// heartbeats find only the replicas that have beaten since, however many
// share it: Recent is the fleet as it was before, which a fallback divides
// limits by and a refill waits for. A replica that stopped is still
// counted for up to two windows, which errs on the safe side (a smaller
// share, a longer wait).
func (f *Fleet) Recent() int { return max(f.recent.get(), f.Live()) }

// RecentWindow is the period over which Recent keeps the largest count.
const RecentWindow = 10 * time.Second

// recentPeak keeps the largest count of the current window and of the one
// before it. Without heartbeats (Redis down) no window closes, so the count
// from before an outage is kept through it.
type recentPeak struct {
	mu        sync.Mutex
	cur, prev int
	curStart  time.Time
}

func (p *recentPeak) note(n int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if now.Sub(p.curStart) >= RecentWindow {
		p.prev, p.cur, p.curStart = p.cur, n, now
		return
	}
	p.cur = max(p.cur, n)
}

func (p *recentPeak) get() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return max(p.cur, p.prev)
}

// Beats returns how many heartbeats reached Redis.
func (f *Fleet) Beats() uint64 { return f.beats.Load() }

func (f *Fleet) loop() {
	defer close(f.done)
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), f.interval)
			f.beat(ctx)
			cancel()
		}
	}
}

// beat writes one heartbeat and reads the count. A failure keeps the last
// count: during an outage it is the fleet as it was when Redis went away.
func (f *Fleet) beat(ctx context.Context) {
	n, err := heartbeatScript.Run(ctx, f.client, []string{f.key},
		f.id, f.ttl.Microseconds(), (f.ttl + f.interval).Milliseconds()).Int64()
	if err != nil {
		if !f.failing.Swap(true) {
			f.log.Warn("fleet: heartbeat failed; the fallback divides limits by the last count",
				"replicas", f.Live(), "err", err)
		}
		return
	}
	f.failing.Store(false)
	f.beats.Add(1)
	if n < 1 {
		n = 1
	}
	f.recent.note(int(n), time.Now())
	if old := f.live.Swap(n); old != n && f.beats.Load() > 1 {
		f.log.Info("fleet: replicas sharing Redis", "replicas", n, "was", old)
	}
	if f.onLive != nil {
		f.onLive(int(n))
	}
}

// Close stops the heartbeats and takes this replica out of the fleet (best
// effort, within ctx), so that the others count it gone at their next
// heartbeat instead of after TTL.
func (f *Fleet) Close(ctx context.Context) error {
	var err error
	f.once.Do(func() {
		close(f.stop)
		<-f.done
		err = f.client.ZRem(ctx, f.key, f.id).Err()
	})
	return err
}
