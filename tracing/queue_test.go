package tracing

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"sync/atomic"

	"github.com/tollgate-llm/tollgate/config"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// stalledExporter holds every export until release is closed, and counts
// the spans it got.
type stalledExporter struct {
	entered chan struct{} // a value per export started
	release chan struct{}
	fail    bool
	mu      sync.Mutex
	got     int
}

func newStalledExporter() *stalledExporter {
	return &stalledExporter{entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (e *stalledExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.entered <- struct{}{}
	select {
	case <-e.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if e.fail {
		return errors.New("collector refused")
	}
	e.mu.Lock()
	e.got += len(spans)
	e.mu.Unlock()
	return nil
}

func (e *stalledExporter) Shutdown(context.Context) error { return nil }

func (e *stalledExporter) exported() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got
}

func testConfig(queue int) config.Tracing {
	c := config.Default().Tracing
	c.Enabled, c.QueueSize, c.ExportTimeoutSeconds = true, queue, 60
	return c
}

func newTestTracer(t *testing.T, c config.Tracing, exp sdktrace.SpanExporter) *Tracer {
	t.Helper()
	tr, err := New(context.Background(), c, Options{Exporter: exp, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func endSpans(tr *Tracer, n int) {
	for range n {
		_, s := tr.Tracer().Start(context.Background(), "s")
		s.End()
	}
}

// TestQueueFullDropsAndCounts: with the exporter stuck in an export and a
// queue of 4, ending 20 more spans returns at once each time (no span waits
// for the collector), 4 are queued, 16 are counted as dropped, and the 4
// are exported once the exporter is free.
func TestQueueFullDropsAndCounts(t *testing.T) {
	exp := newStalledExporter()
	tr := newTestTracer(t, testConfig(4), exp)
	endSpans(tr, 1)
	flushed := make(chan error, 1)
	go func() { flushed <- tr.ForceFlush(context.Background()) }()
	<-exp.entered // the exporter now holds the first span

	endSpans(tr, 20)
	if full, failed := tr.Dropped(); full != 16 || failed != 0 {
		t.Errorf("dropped %d (queue full) and %d (export failed), want 16 and 0", full, failed)
	}
	close(exp.release)
	if err := <-flushed; err != nil {
		t.Fatal(err)
	}
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := exp.exported(); got != 5 {
		t.Errorf("%d spans exported, want 5", got)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestFailedExportCounts: spans whose export fails are counted as dropped
// under export_failed, and the Prometheus collector reports both reasons.
func TestFailedExportCounts(t *testing.T) {
	exp := newStalledExporter()
	exp.fail = true
	close(exp.release)
	tr := newTestTracer(t, testConfig(16), exp)
	endSpans(tr, 3)
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if full, failed := tr.Dropped(); full != 0 || failed != 3 {
		t.Errorf("dropped %d (queue full) and %d (export failed), want 0 and 3", full, failed)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestShutdownBoundedByContext: a shutdown whose exporter never answers
// returns when its context ends, not later.
func TestShutdownBoundedByContext(t *testing.T) {
	exp := newStalledExporter()
	tr := newTestTracer(t, testConfig(16), exp)
	endSpans(tr, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := tr.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want the context's deadline", err)
	}
	close(exp.release) // lets the export goroutine end
	<-tr.proc.done
}

// TestSamplerIsParentBased: a sampled parent is followed whatever the
// ratio, an unsampled one is not exported, and a root span follows the
// ratio (0 here).
func TestSamplerIsParentBased(t *testing.T) {
	exp := newStalledExporter()
	close(exp.release)
	c := testConfig(16)
	c.SampleRatio = 0
	tr := newTestTracer(t, c, exp)
	defer func() { _ = tr.Shutdown(context.Background()) }()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	for _, tc := range []struct {
		name   string
		parent trace.SpanContext
		want   bool
	}{
		{"root", trace.SpanContext{}, false},
		{"sampled parent", trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true}), true},
		{"unsampled parent", trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, Remote: true}), false},
	} {
		ctx := trace.ContextWithRemoteSpanContext(context.Background(), tc.parent)
		_, s := tr.Tracer().Start(ctx, tc.name)
		if got := s.SpanContext().IsSampled(); got != tc.want {
			t.Errorf("%s: sampled %v, want %v", tc.name, got, tc.want)
		}
		s.End()
	}
}

// TestParseHeaders reads the OTEL_EXPORTER_OTLP_HEADERS format and never
// quotes a malformed value.
func TestParseHeaders(t *testing.T) {
	h, err := parseHeaders(" authorization = Bearer x ,x-team=ops")
	if err != nil || len(h) != 2 || h["authorization"] != "Bearer x" || h["x-team"] != "ops" {
		t.Errorf("parseHeaders = %v, %v", h, err)
	}
	if _, err := parseHeaders("Bearer secret-token"); err == nil || strings.Contains(err.Error(), "secret-token") {
		t.Errorf("malformed headers: %v", err)
	}
}

// shutdownCounting is a stalled exporter that counts its Shutdown calls
// and, like the OTLP exporters, aborts the export in flight when shut down.
type shutdownCounting struct {
	*stalledExporter
	shut atomic.Int32
}

func (e *shutdownCounting) Shutdown(context.Context) error {
	if e.shut.Add(1) == 1 {
		close(e.release)
	}
	return nil
}

// TestShutdownPastDeadlineStillStopsExporter: when the collector stalls
// past Shutdown's context, the exporter is still shut down (the OTLP
// exporters then kill the export in flight and close their connection);
// else the export goroutine and the exporter's connection outlive the
// pipeline by up to export_timeout_seconds.
func TestShutdownPastDeadlineStillStopsExporter(t *testing.T) {
	exp := &shutdownCounting{stalledExporter: newStalledExporter()}
	tr := newTestTracer(t, testConfig(16), exp)
	endSpans(tr, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_ = tr.Shutdown(ctx)
	n := exp.shut.Load()
	if n == 0 {
		close(exp.release) // let the worker end for goleak
	}
	<-tr.proc.done
	if n != 1 {
		t.Fatalf("exporter Shutdown called %d times once Shutdown's context ended, want 1", n)
	}
}
