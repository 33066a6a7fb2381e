package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/probe"
)

// reloader re-reads the gateway's config file and swaps it in: on SIGHUP,
// on POST /admin/reload, and when [server] watch_config sees the file
// change. One reload runs at a time. A file that does not load, or that
// changes a key only a restart can, changes nothing.
type reloader struct {
	rg   *runningGateway
	path string
	mu   sync.Mutex
	sum  [sha256.Size]byte // of the document last applied or refused
}

// reload reads the file and swaps it in; why names the trigger in the log.
// It returns the tables and keys that changed.
func (rl *reloader) reload(why string) ([]string, error) {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	rg := rl.rg
	data, err := os.ReadFile(rl.path)
	if err == nil {
		rl.sum = sha256.Sum256(data)
	}
	var next *config.Config
	var changed []string
	if err == nil {
		next, changed, err = config.ParseReload(data, rl.path, os.Getenv, rg.gw.Config())
	}
	if err == nil && len(changed) > 0 {
		err = rl.apply(next, changed)
	}
	rg.metrics.ConfigReloaded(err == nil, time.Now())
	if err != nil {
		rg.log.Error("config reload refused: the running configuration is kept", "trigger", why,
			"config", rl.path, "err", err)
		return nil, err
	}
	if len(changed) == 0 {
		rg.log.Info("config reload: the file equals the running configuration", "trigger", why, "config", rl.path)
		return nil, nil
	}
	rg.log.Info("config reloaded", "trigger", why, "config", rl.path, "changed", strings.Join(changed, ","))
	return changed, nil
}

// check reports whether a config document would reload cleanly, and what
// it would change; nothing changes.
func (rl *reloader) check(doc []byte, name string) ([]string, error) {
	_, changed, err := config.ParseReload(doc, name, os.Getenv, rl.rg.gw.Config())
	return changed, err
}

// serve is Options.Reload: nil reloads the file, a document is checked.
func (rl *reloader) serve(doc []byte, name string) ([]string, error) {
	if doc != nil {
		return rl.check(doc, name)
	}
	return rl.reload("admin")
}

// apply swaps next in: the request path first, then the log level and the
// synthetic probe, which starts again on the new targets when they or the
// upstreams changed.
func (rl *reloader) apply(next *config.Config, changed []string) error {
	rg := rl.rg
	warnConfig(next, rg.log)
	var sched *probe.Scheduler
	failed := true // until the swap
	restartProbe := slices.Contains(changed, "probe") || slices.Contains(changed, "upstreams")
	if restartProbe {
		var err error
		if sched, err = probe.New(next, rg.gw, rg.metrics, probe.Options{Logger: rg.log}); err != nil {
			return err
		}
		// The running probe stops before the swap, so that it writes no
		// series of a target the new config drops.
		old, resume := rg.pauseProbe()
		defer func() {
			if failed {
				sched = old
			}
			resume(sched)
		}()
	}
	// The budgets next adds are raised to the ledger's figures before it
	// serves, so that no request is admitted against an empty one, and
	// again once every request begun before the swap has billed: those
	// settle without the new budgets.
	running := rg.gw.Config()
	raise := func(what string) (added bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		added, err := rg.gov.raiseAdded(ctx, running, next, time.Now())
		if err != nil {
			rg.log.Error("config reload: the budgets it added do not hold today's spend "+what, "err", err)
		}
		return added
	}
	added := raise("before the swap")
	ended, err := rg.gw.Reload(next)
	if err != nil {
		rg.gov.current.Store(running)
		return err
	}
	failed = false
	if added {
		rg.later(func() {
			select {
			case <-ended:
			case <-rg.stopping: // exchanges cut at shutdown may never end
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if err := rg.gov.ledger.Flush(ctx); err != nil {
				rg.log.Warn("config reload: flushing the ledger before raising the added budgets", "err", err)
			}
			cancel()
			raise("after the requests begun before it billed")
		})
	}
	if rg.level != nil {
		_ = rg.level.UnmarshalText([]byte(next.Log.Level))
	}
	return nil
}

// watch polls the config file every interval until ctx ends, and reloads it
// once a change has held for one interval (an editor or a ConfigMap update
// may write it in steps). It reads the file itself, not its time stamps, so
// a symlink swapped under it (Kubernetes) or a file restored with its old
// time is seen too.
func (rl *reloader) watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var pending []byte
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		data, err := os.ReadFile(rl.path)
		if err != nil {
			continue // a file being replaced; the next poll sees it
		}
		rl.mu.Lock()
		same := sha256.Sum256(data) == rl.sum
		rl.mu.Unlock()
		switch {
		case same:
			pending = nil
		case pending != nil && bytes.Equal(pending, data):
			pending = nil
			_, _ = rl.reload("watch")
		default:
			pending = data
		}
	}
}
