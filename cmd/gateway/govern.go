package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/fleet"
	"github.com/tollgate-llm/tollgate/keystore"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/ownership"
	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// governance holds the limiter, the spend ledger and (in mode "keys") the
// owners of stored state a gateway runs with, and the Redis client they
// share when [redis] is set.
type governance struct {
	limiter   ratelimit.Limiter
	ledger    spend.Ledger
	owners    ownership.Store // nil outside mode "keys"
	redis     redis.UniversalClient
	fleet     *fleet.Fleet // the replicas sharing Redis; nil without it
	lock      *fileLock    // on the state file or the spill directory
	ownerLock *fileLock    // on [ownership] state_file
	// conv is the conversation store, nil when [conversations] is off;
	// convLock is on its state file.
	conv     conversation.Store
	convLock *fileLock
	// keys watches the runtime keys' store, nil when [runtime_keys] is
	// off; keysLock is on its state file.
	keys     *keystore.Watcher
	keysLock *fileLock

	// local is the in-process limiter (without Redis) or the fallback
	// (with it); shared is the Redis one. A reload raises the budgets it
	// adds in both.
	local  *ratelimit.Local
	shared *ratelimit.Redis
	// current is the running configuration, which a reload replaces: the
	// refill of a Redis that lost its data charges its budgets.
	current *atomic.Pointer[config.Config]
}

// openGovernance builds the limiter and the ledger from cfg: shared through
// Redis when [redis] addrs are set (with an in-process fallback limiter, per
// ratelimit.on_redis_error), in the process otherwise, with spend kept in
// [spend] state_file and its journal across restarts.
func openGovernance(cfg *config.Config, m *metrics.Metrics, log *slog.Logger) (*governance, error) {
	// One gateway per state file and spill directory: a second one would
	// overwrite the first's spend.
	var lock *fileLock
	var err error
	switch {
	case !cfg.UsesRedis() && cfg.Spend.StateFile != "":
		lock, err = lockFile(cfg.Spend.StateFile+".lock", "[spend] state_file "+cfg.Spend.StateFile)
	case cfg.UsesRedis() && cfg.Redis.SpillDir != "":
		lock, err = lockFile(filepath.Join(cfg.Redis.SpillDir, "tollgate.lock"), "[redis] spill_dir "+cfg.Redis.SpillDir)
	}
	if err != nil {
		return nil, err
	}
	// Without Redis the runtime keys are read first: the in-process
	// limiter is seeded with what their budgets used today, as the
	// [[keys]] tables' are.
	var localKeys *keystore.Local
	var keysLock *fileLock
	var seed keystore.Snapshot
	if cfg.RuntimeKeys.Enabled && !cfg.UsesRedis() {
		localKeys, keysLock, seed, err = openLocalKeys(cfg)
		if err != nil {
			_ = lock.Unlock()
			return nil, err
		}
	}
	g, err := openBackends(cfg, withRuntimeKeys(cfg, seed), m, log)
	if err != nil {
		_ = keysLock.Unlock()
		_ = lock.Unlock()
		return nil, err
	}
	g.lock, g.keysLock = lock, keysLock
	switch {
	case localKeys != nil:
		g.keys = newKeysWatcher(localKeys, cfg, log)
	case cfg.RuntimeKeys.Enabled:
		g.keys = newKeysWatcher(keystore.NewRedis(g.redis, cfg.Redis.KeyPrefix), cfg, log)
	}
	if err := g.openOwners(cfg, log); err != nil {
		_ = g.Close()
		return nil, err
	}
	return g, nil
}

// openLocalKeys opens [runtime_keys] state_file (locked: one gateway per
// file) and reads the keys it holds.
func openLocalKeys(cfg *config.Config) (*keystore.Local, *fileLock, keystore.Snapshot, error) {
	file := cfg.RuntimeKeys.StateFile
	var lock *fileLock
	if file != "" {
		var err error
		if lock, err = lockFile(file+".lock", "[runtime_keys] state_file "+file); err != nil {
			return nil, nil, keystore.Snapshot{}, err
		}
	}
	l, err := keystore.NewLocal(file)
	if err != nil {
		_ = lock.Unlock()
		return nil, nil, keystore.Snapshot{}, err
	}
	snap, err := l.Snapshot(context.Background())
	if err != nil {
		_ = l.Close()
		_ = lock.Unlock()
		return nil, nil, keystore.Snapshot{}, err
	}
	return l, lock, snap, nil
}

// newKeysWatcher watches s every [runtime_keys] poll_interval_ms; each read
// is bounded by the Redis command timeout (or the interval, without Redis).
func newKeysWatcher(s keystore.Store, cfg *config.Config, log *slog.Logger) *keystore.Watcher {
	timeout := config.Millis(cfg.Redis.TimeoutMs)
	if !cfg.UsesRedis() {
		timeout = 0
	}
	return keystore.NewWatcher(s, keystore.WatchOptions{Interval: cfg.RuntimeKeys.PollInterval(), Timeout: timeout, Logger: log})
}

// withRuntimeKeys is cfg with the runtime keys of snap that admit callers
// (not revoked, not expired, not shadowed by a [[keys]] name) appended to
// its [[keys]], for what counts keys' usage by name: the seeding of an
// in-process limiter's budgets and rates at start.
func withRuntimeKeys(cfg *config.Config, snap keystore.Snapshot) *config.Config {
	if len(snap.Keys) == 0 {
		return cfg
	}
	out := *cfg
	out.Keys = slices.Clone(cfg.Keys)
	now := time.Now()
	for _, k := range snap.Keys {
		if k.Status(now) == "active" && !slices.ContainsFunc(cfg.Keys, func(c config.Key) bool { return c.Name == k.Name }) {
			out.Keys = append(out.Keys, k.Key)
		}
	}
	return &out
}

// openOwners opens the record of who owns stored responses and
// conversations, in mode "keys": in Redis when [redis] is set, shared by
// every replica, else in [ownership] state_file.
func (g *governance) openOwners(cfg *config.Config, log *slog.Logger) error {
	switch {
	case cfg.Auth.Mode != "keys":
		return nil
	case g.redis != nil:
		g.owners = ownership.NewRedis(g.redis, cfg.Redis.KeyPrefix+"own:")
		return nil
	}
	file := cfg.Ownership.StateFile
	if file != "" {
		lock, err := lockFile(file+".lock", "[ownership] state_file "+file)
		if err != nil {
			return err
		}
		g.ownerLock = lock
	}
	owners, err := ownership.NewLocal(ownership.LocalOptions{File: file, Logger: log})
	if err != nil {
		return err
	}
	g.owners = owners
	return nil
}

// openBackends builds the limiter and the ledger (see openGovernance). An
// in-process limiter is seeded from the ledger for the keys of seedCfg
// (cfg with the runtime keys).
func openBackends(cfg, seedCfg *config.Config, m *metrics.Metrics, log *slog.Logger) (*governance, error) {
	flush := config.Seconds(cfg.Spend.FlushIntervalSeconds)
	current := new(atomic.Pointer[config.Config])
	current.Store(cfg)
	local := ratelimit.NewLocal(ratelimit.LocalOptions{})
	if !cfg.UsesRedis() {
		rates := newRateSeeder(seedCfg)
		ledger, err := spend.NewLocal(spend.LocalOptions{StateFile: cfg.Spend.StateFile, FlushInterval: flush,
			Logger: log, Journal: true, JournalSync: config.Millis(cfg.Spend.JournalSyncMs), OnReplay: rates.add})
		if err == nil {
			// Limits live in this process: restore what the persisted
			// ledger (its journal replayed) says was used today and this
			// month, and the rate buckets from the journal's last minute.
			err = seedBudgets(context.Background(), local, ledger, seedCfg, time.Now())
			if err != nil {
				_ = ledger.Close()
			}
			rates.seed(local)
		}
		if err != nil {
			_ = local.Close()
			return nil, err
		}
		return &governance{limiter: local, ledger: ledger, local: local, current: current}, nil
	}
	rc := cfg.Redis
	opts := &redis.UniversalOptions{
		Addrs:        rc.Addrs,
		MasterName:   rc.MasterName,
		Username:     rc.Username,
		Password:     rc.Password.Reveal(),
		DB:           rc.DB,
		DialTimeout:  config.Millis(rc.DialTimeoutMs),
		ReadTimeout:  config.Millis(rc.TimeoutMs),
		WriteTimeout: config.Millis(rc.TimeoutMs),
		// Failing fast lets the limiter fall back instead of retrying
		// against a Redis that is down while the request waits: go-redis
		// would otherwise retry commands, and dial 5 times 100 ms apart.
		MaxRetries:    -1,
		DialerRetries: 1,
		// The handshake for maintenance notifications (a Redis Enterprise
		// feature) costs a round trip per new connection, fails on every
		// open-source Redis, and its fallback races in go-redis v9.23
		// when connections dial at once.
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
	if rc.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client := redis.NewUniversalClient(opts)
	// Each part opened is closed again, last first, if a later one fails.
	var undo []func()
	fail := func(err error) (*governance, error) {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		return nil, err
	}
	undo = append(undo, func() { _ = local.Close(); _ = client.Close() })
	// The heartbeat tells this replica how many share the limits, which
	// its fallback divides them by while Redis is down.
	ctx, cancel := context.WithTimeout(context.Background(), config.Millis(rc.DialTimeoutMs)+config.Millis(rc.TimeoutMs))
	fl, err := fleet.New(ctx, client, fleet.Options{Prefix: rc.KeyPrefix, Logger: log, OnLive: m.SetReplicas})
	cancel()
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = fl.Close(ctx)
		cancel()
	})
	warnIfRedisForgets(client, log)
	// The spill file keeps settlements and budget charges a replica could
	// not send before it stopped; the next start replays them.
	// On a single Redis (or Sentinel) the limiter decides nothing on data
	// of another generation than the ledger found whole: a Redis restarted
	// empty is refilled first. On a Cluster the generation lives on another
	// master than the limits, which the scripts cannot read.
	_, cluster := client.(*redis.ClusterClient)
	genKey := spend.GenerationKey(rc.KeyPrefix)
	if cluster {
		genKey = ""
	}
	shared := ratelimit.NewRedis(client, ratelimit.RedisOptions{Prefix: rc.KeyPrefix + "rl:", GenerationKey: genKey})
	// The ledger is opened below; the limiter asks it to refill at once
	// when an admission finds Redis emptied.
	var ledger atomic.Pointer[spend.Redis]
	limiter, err := ratelimit.NewFailover(ratelimit.FailoverOptions{
		Primary:    shared,
		Fallback:   local,
		Deny:       cfg.RateLimit.OnRedisError == "deny",
		RetryAfter: config.Seconds(cfg.RateLimit.RedisRetrySeconds),
		OnDegraded: func(d bool) { m.SetDegraded("ratelimit", d) },
		OnDataLost: func() {
			if l := ledger.Load(); l != nil {
				l.CheckNow()
			}
		},
		Replicas:  fl.Recent,
		Logger:    log,
		SpillFile: spillPath(rc.SpillDir, "tollgate-ratelimit-spill.json"),
	})
	if err != nil {
		return fail(err)
	}
	undo = append(undo, func() { _ = limiter.Close() })
	// The spill file holds what a replica could not send to Redis before it
	// stopped; the next start sends it, under the same batch ids. The
	// journal holds every billed request until Redis applied it, so that a
	// killed replica's next start sends what it had not, under the same
	// batch ids too. The own file is what this replica billed, which
	// refills a Redis that lost its data and answers /admin/spend (flagged
	// partial) while Redis is down.
	// The budgets' counters are refilled with the ledger only on a single
	// Redis (or Sentinel), where they were lost with it. On a Cluster they
	// live on other masters than the ledger's generation, which may well
	// have kept them: charging them again would refuse teams at half
	// their budget.
	// The rate buckets were lost too: each replica raises them to what it
	// last heard of them (and what its fallback admitted since), before
	// the ledger can be whole and the limiter decides on Redis again.
	refill := func(ctx context.Context, rows []spend.Row, id string) error {
		if err := limiter.RestoreRates(ctx); err != nil {
			return err
		}
		return refillBudgets(ctx, shared, rows, current.Load(), time.Now(), id)
	}
	if cluster {
		refill = nil
	}
	// redis_data is 1 from the moment this replica finds Redis emptied
	// until every replica's spend is back (OnDataLost), and the limiter
	// decides on Redis again under the generation the ledger then names.
	sl, err := spend.NewRedis(client, spend.RedisOptions{Prefix: rc.KeyPrefix, FlushInterval: flush, Logger: log,
		SpillFile:   spillPath(rc.SpillDir, "tollgate-spend-spill.json"),
		Journal:     spillPath(rc.SpillDir, "tollgate-spend.journal"),
		JournalSync: config.Millis(cfg.Spend.JournalSyncMs),
		OwnFile:     spillPath(rc.SpillDir, "tollgate-spend-own.json"),
		OnDegraded:  func(d bool) { m.SetDegraded("spend", d) },
		OnDataLost:  func(lost bool) { m.SetDegraded("redis_data", lost) },
		OnRefill:    refill,
		OnWhole:     shared.SetGeneration,
		Replicas:    fl.Recent})
	if err != nil {
		return fail(err)
	}
	ledger.Store(sl)
	return &governance{limiter: limiter, ledger: sl, redis: client, fleet: fl, local: local, shared: shared, current: current}, nil
}

// raiseAdded tells every budget that next gives a key or team and running
// did not what the ledger says that key or team used already today and this
// month: the limiter counted nothing against a budget that did not exist
// (or has not since it was removed). The counters are raised to the
// ledger's figures, never added to, so raising again (after the requests of
// the old configuration have billed) or from every replica raises once.
// next also becomes the configuration a refill charges. added says whether
// next adds any budget.
func (g *governance) raiseAdded(ctx context.Context, running, next *config.Config, now time.Time) (added bool, err error) {
	g.current.Store(next)
	fresh := addedBudgets(running, next)
	if len(fresh.Keys)+len(fresh.Teams) == 0 {
		return false, nil
	}
	now = now.UTC()
	monthStart := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC).Format(time.DateOnly)
	rows, err := g.ledger.Query(ctx, spend.Filter{From: monthStart, To: now.Format(time.DateOnly)})
	if err != nil {
		return true, fmt.Errorf("reading this month's spend for the budgets the reload added: %w", err)
	}
	for s, u := range budgetUsage(rows, fresh, now) {
		if g.local != nil {
			g.local.RaiseTo(s, now, u.dayTokens, u.dayCost, u.monthCost)
		}
		if g.shared != nil {
			if err := g.shared.RaiseTo(ctx, s, now, u.dayTokens, u.dayCost, u.monthCost); err != nil {
				return true, err
			}
		}
	}
	return true, nil
}

// warnIfRedisForgets warns when Redis keeps its data only in memory: a
// restart then empties it, and with it the limits' state and the spend not
// yet refilled from the replicas' own files. A Redis that does not allow
// CONFIG (a managed one) is not asked twice.
func warnIfRedisForgets(client redis.UniversalClient, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	v, err := client.ConfigGet(ctx, "appendonly").Result()
	if err != nil {
		return
	}
	if v["appendonly"] == "no" {
		log.Warn("Redis runs without an append-only file (appendonly no): a restart empties it, granting every limit afresh; " +
			"each replica then refills the spend it billed from [redis] spill_dir. Configure appendonly yes, appendfsync everysec")
	}
}

// Close flushes the ledger and releases everything; it reports what failed.
func (g *governance) Close() error {
	var errs []error
	if f, ok := g.limiter.(*ratelimit.Failover); ok {
		// Settlements and charges queued while Redis was down: write them
		// now if Redis is back; otherwise Close spills them to
		// [redis] spill_dir for the next start.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := f.Retry(ctx); err != nil {
			errs = append(errs, fmt.Errorf("replaying queued rate-limit settlements: %w", err))
		}
		cancel()
	}
	if err := g.ledger.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the spend ledger: %w", err))
	}
	if err := g.limiter.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing the limiter: %w", err))
	}
	if g.conv != nil {
		// Every exchange has recorded its turn: the last flush loses none.
		if err := g.conv.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the conversation store: %w", err))
		}
	}
	if g.owners != nil {
		if err := g.owners.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the ownership store: %w", err))
		}
	}
	if g.keys != nil {
		// The watcher reads the store, which may be on the Redis client:
		// it stops first.
		g.keys.Close()
		if err := g.keys.Store().Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the runtime keys' store: %w", err))
		}
	}
	if g.fleet != nil {
		// Out of the fleet at once, so that the others' share grows now;
		// with Redis down, the entry expires with its TTL instead.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = g.fleet.Close(ctx)
		cancel()
	}
	if g.redis != nil {
		if err := g.redis.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the Redis client: %w", err))
		}
	}
	if err := g.lock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("releasing the state file lock: %w", err))
	}
	if err := g.ownerLock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("releasing the ownership file lock: %w", err))
	}
	if err := g.keysLock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("releasing the runtime keys file lock: %w", err))
	}
	if err := g.convLock.Unlock(); err != nil {
		errs = append(errs, fmt.Errorf("releasing the conversations file lock: %w", err))
	}
	return errors.Join(errs...)
}

// spillPath names a spill file in dir, or "" (no spill) when dir is "".
func spillPath(dir, name string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, name)
}
