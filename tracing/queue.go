package tracing

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Batching defaults, those of the SDK's BatchSpanProcessor but for a
// shorter delay (spans show up in a second, not five).
const (
	maxBatch   = 512
	batchDelay = time.Second
)

// queueProcessor is a batching span processor whose OnEnd never waits: a
// finished span goes into a bounded queue, or, the queue full, is dropped
// and counted. One goroutine exports batches of up to maxBatch spans,
// every batchDelay or when a batch is full.
//
// The SDK's BatchSpanProcessor drops the same way but keeps its count to
// itself (and its blocking option would make the relay wait on the
// collector), so tollgate uses this one in its place to export
// tollgate_tracing_dropped_spans_total. Spans whose export fails (the
// collector down or too slow) are counted as dropped too, under a reason
// of their own.
type queueProcessor struct {
	exp     sdktrace.SpanExporter
	timeout time.Duration
	log     *slog.Logger

	queue chan sdktrace.ReadOnlySpan
	flush chan chan struct{}
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	queueFull    atomic.Uint64
	exportFailed atomic.Uint64
	failing      bool // the last export failed (worker goroutine only)
}

func newQueueProcessor(exp sdktrace.SpanExporter, size int, timeout time.Duration, log *slog.Logger) *queueProcessor {
	p := &queueProcessor{
		exp: exp, timeout: timeout, log: log,
		queue: make(chan sdktrace.ReadOnlySpan, size),
		flush: make(chan chan struct{}),
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	go p.run()
	return p
}

// OnStart does nothing: spans are handed on when they end.
func (p *queueProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues s for export, or drops and counts it when the queue is
// full. It never blocks.
func (p *queueProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	select {
	case p.queue <- s:
	default:
		p.queueFull.Add(1)
	}
}

// ForceFlush exports every queued span, waiting at most until ctx ends.
func (p *queueProcessor) ForceFlush(ctx context.Context) error {
	ch := make(chan struct{})
	select {
	case p.flush <- ch:
	case <-p.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown exports what is queued and shuts the exporter down, waiting at
// most until ctx ends. Spans that end after it are dropped. Past ctx, the
// exporter is shut down all the same (with ctx ended, it cancels an export
// in flight and closes its connection), and what was still queued is
// counted as dropped.
func (p *queueProcessor) Shutdown(ctx context.Context) error {
	p.once.Do(func() { close(p.stop) })
	select {
	case <-p.done:
		return p.exp.Shutdown(ctx)
	case <-ctx.Done():
		p.exportFailed.Add(uint64(len(p.queue)))
		_ = p.exp.Shutdown(ctx)
		return ctx.Err()
	}
}

// run is the export goroutine.
func (p *queueProcessor) run() {
	defer close(p.done)
	batch := make([]sdktrace.ReadOnlySpan, 0, maxBatch)
	tick := time.NewTicker(batchDelay)
	defer tick.Stop()
	for {
		select {
		case s := <-p.queue:
			if batch = append(batch, s); len(batch) == maxBatch {
				batch = p.export(batch)
			}
		case <-tick.C:
			batch = p.export(batch)
		case ch := <-p.flush:
			batch = p.export(p.drain(batch))
			close(ch)
		case <-p.stop:
			p.export(p.drain(batch))
			return
		}
	}
}

// drain moves every queued span into batch, exporting full batches on the
// way, and returns what is left.
func (p *queueProcessor) drain(batch []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	for {
		select {
		case s := <-p.queue:
			if batch = append(batch, s); len(batch) == maxBatch {
				batch = p.export(batch)
			}
		default:
			return batch
		}
	}
}

// export sends batch, within the export timeout, and returns it emptied.
// A failure is logged when exports start failing and when they recover,
// not once a batch.
func (p *queueProcessor) export(batch []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	if len(batch) == 0 {
		return batch
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	err := p.exp.ExportSpans(ctx, batch)
	cancel()
	switch {
	case err != nil:
		p.exportFailed.Add(uint64(len(batch)))
		if !p.failing && p.log != nil {
			p.log.Warn("tracing: exporting spans failed; dropping them until the collector answers",
				"spans", len(batch), "err", err)
		}
		p.failing = true
	case p.failing:
		p.failing = false
		if p.log != nil {
			p.log.Info("tracing: exporting spans again")
		}
	}
	clear(batch)
	return batch[:0]
}
