package keystore

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// WatchOptions configure a Watcher.
type WatchOptions struct {
	// Interval is how often the store's version is read. Required > 0
	// unless Tick is set.
	Interval time.Duration
	// Tick, if set, replaces the interval's ticker (tests make time pass
	// by sending on it).
	Tick <-chan time.Time
	// Timeout bounds each read of the store. Default: Interval, at least
	// 100 ms.
	Timeout time.Duration
	// Logger receives a warning when the store cannot be read, and a note
	// when it can be again. Nil: discard.
	Logger *slog.Logger
}

// Watcher keeps a replica's runtime keys up to date: every interval it
// reads the store's version (one read) and, when it changed, the keys
// (another), and hands them to the function Start was given. A key issued
// or revoked anywhere is thus applied within one interval plus the two
// reads. While the store cannot be read, the last keys read stay in force:
// a key revoked then is revoked in the store only once the store is back
// (the revocation itself needs the store), and the keys are read again as
// soon as it answers.
//
// All reads happen on the watcher's one goroutine, so the keys are handed
// on in the store's order; Refresh asks that goroutine to read at once.
type Watcher struct {
	store Store
	opts  WatchOptions
	log   *slog.Logger

	apply   func(Snapshot)
	refresh chan chan error
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
	version int64
	failing bool
}

// NewWatcher returns a watcher of s; Start starts it.
func NewWatcher(s Store, opts WatchOptions) *Watcher {
	if opts.Timeout <= 0 {
		opts.Timeout = max(opts.Interval, 100*time.Millisecond)
	}
	w := &Watcher{store: s, opts: opts, log: opts.Logger, refresh: make(chan chan error),
		stop: make(chan struct{}), done: make(chan struct{})}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	return w
}

// Store is the store watched.
func (w *Watcher) Store() Store { return w.store }

// Start reads the keys once, hands them to apply before it returns (so a
// gateway serves with its keys from the first request), then watches in
// the background until Close. A store that cannot be read at start is an
// error and nothing starts.
func (w *Watcher) Start(ctx context.Context, apply func(Snapshot)) error {
	snap, err := w.store.Snapshot(ctx)
	if err != nil {
		return err
	}
	w.apply = apply
	w.version = snap.Version
	apply(snap)
	tick := w.opts.Tick
	var t *time.Ticker
	if tick == nil {
		t = time.NewTicker(w.opts.Interval)
		tick = t.C
	}
	go w.run(tick, t)
	return nil
}

func (w *Watcher) run(tick <-chan time.Time, t *time.Ticker) {
	defer close(w.done)
	if t != nil {
		defer t.Stop()
	}
	for {
		select {
		case <-w.stop:
			return
		case <-tick:
			_ = w.poll()
		case reply := <-w.refresh:
			reply <- w.poll()
		}
	}
}

// poll reads the version and, when it changed, the keys, and applies them.
func (w *Watcher) poll() error {
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.Timeout)
	defer cancel()
	v, err := w.store.Version(ctx)
	if err == nil && v != w.version {
		var snap Snapshot
		if snap, err = w.store.Snapshot(ctx); err == nil {
			w.version = snap.Version
			w.apply(snap)
		}
	}
	switch {
	case err != nil && !w.failing:
		w.failing = true
		w.log.Warn("runtime keys: the store cannot be read; the keys read last stay in force until it can", "err", err)
	case err == nil && w.failing:
		w.failing = false
		w.log.Info("runtime keys: the store can be read again")
	}
	return err
}

// errStopped is Refresh's error once the watcher is closed or not started.
var errStopped = errors.New("keystore: the watcher is not running")

// Refresh reads the store now and applies what changed before it returns:
// the replica that made a change serves it from its next request.
func (w *Watcher) Refresh(ctx context.Context) error {
	if w.apply == nil {
		return errStopped
	}
	reply := make(chan error, 1)
	select {
	case w.refresh <- reply:
	case <-w.done:
		return errStopped
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close stops the watching goroutine and waits for it; it does not close
// the store. Closing a watcher never started, or twice, is fine.
func (w *Watcher) Close() {
	w.once.Do(func() { close(w.stop) })
	if w.apply != nil {
		<-w.done
	}
}
