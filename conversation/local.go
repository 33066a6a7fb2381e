package conversation

import (
	"container/list"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/atomicfile"
)

// Local is a Store in the process. Conversations are kept in the order of
// their last turn, so ending the idle ones and evicting the oldest cost
// O(1) each. With LocalOptions.File they are written there every Interval
// and at Close, and read back by the next NewLocal: a restart keeps them
// (a killed process loses the turns of its last interval).
type Local struct {
	opts Options
	file string
	log  *slog.Logger

	mu sync.Mutex
	// byKey indexes order, whose elements hold *entry, oldest turn first.
	byKey map[string]*list.Element
	order *list.List
	// links maps linkKey(response id) to its conversation; linkQueue holds
	// them in the order they expire (they all live linkLifetime).
	links     map[string]link
	linkQueue []queuedLink
	dirty     bool

	writeMu sync.Mutex // one state file write at a time
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// entry is one active conversation and when its last turn was recorded.
type entry struct {
	c    Conversation
	seen time.Time
}

// link is the conversation a response belongs to, until expires.
type link struct {
	Key     string    `json:"key"`
	Expires time.Time `json:"expires"`
}

type queuedLink struct {
	id      string
	expires time.Time
}

// LocalOptions configure a Local store.
type LocalOptions struct {
	Options
	// File keeps the conversations across restarts; "" keeps them in
	// memory only.
	File string
	// Logger receives the state file's write errors. Default slog.Default().
	Logger *slog.Logger
}

// localState is the state file's document.
type localState struct {
	Version       int             `json:"version"`
	Conversations []savedEntry    `json:"conversations"`
	Links         map[string]link `json:"links"`
}

type savedEntry struct {
	Conversation
	Seen time.Time `json:"seen"`
	// Prompts are the breakdown's distinct prompts, so that a restart
	// does not count them again.
	Prompts []string `json:"prompt_ids,omitempty"`
}

const localStateVersion = 1

// linkKey names a response in the links, so that no upstream id is kept.
func linkKey(responseID string) string { return Key("response", responseID) }

// NewLocal returns a Local store, reading opts.File if it exists; a file it
// cannot read or decode is an error. It starts one goroutine, stopped by
// Close.
func NewLocal(opts LocalOptions) (*Local, error) {
	opts.fill()
	l := &Local{opts: opts.Options, file: opts.File, log: opts.Logger,
		byKey: make(map[string]*list.Element), order: list.New(), links: make(map[string]link),
		stop: make(chan struct{}), done: make(chan struct{})}
	if l.log == nil {
		l.log = slog.Default()
	}
	if l.file != "" {
		var st localState
		found, err := atomicfile.ReadJSON("conversation", "state file", l.file, &st)
		if err != nil {
			return nil, err
		}
		if found && st.Version != localStateVersion {
			return nil, fmt.Errorf("conversation: state file %s has version %d, want %d", l.file, st.Version, localStateVersion)
		}
		l.restore(&st)
	}
	go l.run()
	return l, nil
}

// restore loads a state file's conversations and links, oldest turn first.
func (l *Local) restore(st *localState) {
	for i := range st.Conversations {
		s := &st.Conversations[i]
		if s.Key == "" {
			continue
		}
		e := &entry{c: s.Conversation, seen: s.Seen}
		for _, p := range s.Prompts {
			e.c.Breakdown.addPrompt(p)
		}
		e.c.Breakdown.Prompts = max(e.c.Breakdown.Prompts, s.Conversation.Breakdown.Prompts)
		l.insertBySeen(e)
	}
	for id, lk := range st.Links {
		l.links[id] = lk
		l.linkQueue = append(l.linkQueue, queuedLink{id: id, expires: lk.Expires})
	}
	sortQueue(l.linkQueue)
}

// insertBySeen puts e in order by its seen time (restore only: the file
// may list them in any order).
func (l *Local) insertBySeen(e *entry) {
	at := l.order.Back()
	for at != nil && at.Value.(*entry).seen.After(e.seen) {
		at = at.Prev()
	}
	var el *list.Element
	if at == nil {
		el = l.order.PushFront(e)
	} else {
		el = l.order.InsertAfter(e, at)
	}
	l.byKey[e.c.Key] = el
}

func sortQueue(q []queuedLink) {
	for i := 1; i < len(q); i++ { // insertion sort: restore only
		for j := i; j > 0 && q[j].expires.Before(q[j-1].expires); j-- {
			q[j], q[j-1] = q[j-1], q[j]
		}
	}
}

// Record implements Store.
func (l *Local) Record(t Turn) {
	if t.Key == "" {
		return
	}
	now := l.opts.Now()
	var evicted []Conversation
	l.mu.Lock()
	el := l.byKey[t.Key]
	if el == nil {
		el = l.order.PushBack(&entry{})
		l.byKey[t.Key] = el
		for l.order.Len() > l.opts.MaxActive {
			front := l.order.Front()
			e := front.Value.(*entry)
			l.order.Remove(front)
			delete(l.byKey, e.c.Key)
			evicted = append(evicted, e.c)
		}
	} else {
		l.order.MoveToBack(el)
	}
	e := el.Value.(*entry)
	e.c.add(&t)
	e.seen = now
	l.dirty = true
	l.mu.Unlock()
	for _, c := range evicted {
		l.opts.OnEnd(c, EndEvicted)
	}
}

// Active returns the number of active conversations.
func (l *Local) Active() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.order.Len()
}

// Get implements Store.
func (l *Local) Get(_ context.Context, key string) (Conversation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el := l.byKey[key]
	if el == nil {
		return Conversation{}, ErrUnknown
	}
	return clone(&el.Value.(*entry).c), nil
}

// clone copies c with its own TTFTs, outcome and breakdown.
func clone(c *Conversation) Conversation {
	out := *c
	out.TTFTs = append([]time.Duration(nil), c.TTFTs...)
	out.Breakdown = c.Breakdown.clone()
	if c.Outcome != nil {
		o := *c.Outcome
		if o.Score != nil {
			s := *o.Score
			o.Score = &s
		}
		out.Outcome = &o
	}
	return out
}

// Cost implements Store.
func (l *Local) Cost(_ context.Context, key string) (int64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el := l.byKey[key]; el != nil {
		return el.Value.(*entry).c.CostMicros, nil
	}
	return 0, nil
}

// SetOutcome implements Store.
func (l *Local) SetOutcome(_ context.Context, key string, o Outcome) (Conversation, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	el := l.byKey[key]
	if el == nil {
		return Conversation{}, ErrUnknown
	}
	e := el.Value.(*entry)
	if e.c.Outcome != nil {
		return clone(&e.c), ErrOutcomeSet
	}
	if o.Score != nil {
		s := *o.Score
		o.Score = &s
	}
	e.c.Outcome = &o
	l.dirty = true
	return clone(&e.c), nil
}

// Link implements Store.
func (l *Local) Link(_ context.Context, responseID, key string) error {
	id := linkKey(responseID)
	exp := l.opts.Now().Add(linkLifetime(l.opts.IdleTimeout))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.links[id] = link{Key: key, Expires: exp}
	l.linkQueue = append(l.linkQueue, queuedLink{id: id, expires: exp})
	// Bound the links as the conversations are: the oldest go first.
	for len(l.links) > 4*l.opts.MaxActive && len(l.linkQueue) > 0 {
		l.dropFirstLinkLocked()
	}
	l.dirty = true
	return nil
}

// dropFirstLinkLocked removes the link that expires first (if the queue
// entry is still its latest).
func (l *Local) dropFirstLinkLocked() {
	q := l.linkQueue[0]
	l.linkQueue = l.linkQueue[1:]
	if lk, ok := l.links[q.id]; ok && !lk.Expires.After(q.expires) {
		delete(l.links, q.id)
	}
}

// Resolve implements Store.
func (l *Local) Resolve(_ context.Context, responseID string) (string, error) {
	now := l.opts.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	lk, ok := l.links[linkKey(responseID)]
	if !ok || !lk.Expires.After(now) {
		return "", nil
	}
	return lk.Key, nil
}

// run ends idle conversations and writes the state file every Interval.
func (l *Local) run() {
	defer close(l.done)
	t := time.NewTicker(l.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
			l.tick(context.Background())
		}
	}
}

// tick ends the conversations idle for IdleTimeout, forgets expired links,
// and writes the state file if anything changed.
func (l *Local) tick(ctx context.Context) {
	now := l.opts.Now()
	var ended []Conversation
	l.mu.Lock()
	for front := l.order.Front(); front != nil; front = l.order.Front() {
		e := front.Value.(*entry)
		if now.Sub(e.seen) < l.opts.IdleTimeout {
			break
		}
		l.order.Remove(front)
		delete(l.byKey, e.c.Key)
		ended = append(ended, e.c)
		l.dirty = true
	}
	for len(l.linkQueue) > 0 && !l.linkQueue[0].expires.After(now) {
		l.dropFirstLinkLocked()
		l.dirty = true
	}
	if len(l.linkQueue) == 0 {
		l.linkQueue = nil // let the backing array go
	}
	l.mu.Unlock()
	for _, c := range ended {
		l.opts.OnEnd(c, EndIdle)
	}
	if err := l.Flush(ctx); err != nil {
		l.log.Error("writing the conversations' state file failed; retried next interval", "err", err)
	}
}

// Flush implements Store: it writes the state file if anything changed.
func (l *Local) Flush(context.Context) error {
	if l.file == "" {
		return nil
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	l.mu.Lock()
	if !l.dirty {
		l.mu.Unlock()
		return nil
	}
	st := localState{Version: localStateVersion, Conversations: make([]savedEntry, 0, l.order.Len()),
		Links: make(map[string]link, len(l.links))}
	for el := l.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		saved := savedEntry{Conversation: clone(&e.c), Seen: e.seen}
		for p := range e.c.Breakdown.prompts {
			saved.Prompts = append(saved.Prompts, p)
		}
		st.Conversations = append(st.Conversations, saved)
	}
	for id, lk := range l.links {
		st.Links[id] = lk
	}
	l.dirty = false
	l.mu.Unlock()
	data, err := json.Marshal(&st)
	if err == nil {
		err = atomicfile.Write(l.file, data)
	}
	if err != nil {
		l.mu.Lock()
		l.dirty = true
		l.mu.Unlock()
		return fmt.Errorf("conversation: writing state file %s: %w", l.file, err)
	}
	return nil
}

// Close implements Store: it stops the background goroutine and writes the
// state file one last time.
func (l *Local) Close() error {
	l.once.Do(func() { close(l.stop) })
	<-l.done
	return l.Flush(context.Background())
}
