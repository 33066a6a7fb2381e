// Package tracing sets up OpenTelemetry traces for the gateway: the SDK's
// tracer provider, an OTLP exporter over HTTP or gRPC, a parent-based
// ratio sampler, a bounded export queue that drops (and counts) rather
// than wait, and the W3C trace-context propagator. The names of the spans
// and attributes are in genai.go; package proxy makes the spans.
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/tollgate-llm/tollgate/config"
)

// Propagator reads and writes W3C traceparent and tracestate: a caller's
// trace is continued, and each attempt's span is passed to the upstream.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// instrumentationName is the tracer's (the instrumentation scope's) name.
const instrumentationName = "github.com/tollgate-llm/tollgate/proxy"

// Tracer is the gateway's trace pipeline. Create it with New; Shutdown
// flushes it.
type Tracer struct {
	provider *sdktrace.TracerProvider
	tracer   trace.Tracer
	proc     *queueProcessor
}

// Options are what New needs beside the [tracing] table.
type Options struct {
	// Logger receives export failures (once when they start, once when
	// they stop). If nil, slog.Default() is used.
	Logger *slog.Logger
	// Version is the service.version resource attribute; omitted if "".
	Version string
	// Exporter replaces the OTLP exporter (tests). If nil, one is built
	// from the configuration.
	Exporter sdktrace.SpanExporter
}

// New builds the pipeline of an enabled [tracing] table. The exporter
// connects lazily: a collector that is down at start is no error, its
// spans are dropped and counted.
func New(ctx context.Context, c config.Tracing, o Options) (*Tracer, error) {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	exp := o.Exporter
	if exp == nil {
		var err error
		if exp, err = newExporter(ctx, c); err != nil {
			return nil, fmt.Errorf("tracing: %w", err)
		}
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", c.ServiceName)}
	if o.Version != "" {
		attrs = append(attrs, attribute.String("service.version", o.Version))
	}
	// resource.Default adds the SDK's attributes and OTEL_RESOURCE_ATTRIBUTES;
	// the service name of the config wins over both.
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	timeout := time.Duration(c.ExportTimeoutSeconds * float64(time.Second))
	proc := newQueueProcessor(exp, c.QueueSize, timeout, o.Logger)
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))),
		sdktrace.WithSpanProcessor(proc),
	)
	return &Tracer{provider: tp, tracer: tp.Tracer(instrumentationName), proc: proc}, nil
}

// newExporter returns the OTLP exporter the table names.
func newExporter(ctx context.Context, c config.Tracing) (sdktrace.SpanExporter, error) {
	headers, err := parseHeaders(c.Headers.Reveal())
	if err != nil {
		return nil, err
	}
	timeout := time.Duration(c.ExportTimeoutSeconds * float64(time.Second))
	isURL := strings.Contains(c.Endpoint, "://")
	if c.Protocol == config.TracingGRPC {
		opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(timeout)}
		switch {
		case isURL:
			opts = append(opts, otlptracegrpc.WithEndpointURL(c.Endpoint))
		case c.Endpoint != "":
			opts = append(opts, otlptracegrpc.WithEndpoint(c.Endpoint))
		}
		if c.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		if len(headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(headers))
		}
		return otlptracegrpc.New(ctx, opts...)
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithTimeout(timeout)}
	switch {
	case isURL:
		// The exporter takes a URL's path as it is, "" too: a URL naming
		// only the collector gets the OTLP/HTTP default path.
		u := c.Endpoint
		if p, err := url.Parse(u); err == nil && (p.Path == "" || p.Path == "/") {
			p.Path = "/v1/traces"
			u = p.String()
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	case c.Endpoint != "":
		opts = append(opts, otlptracehttp.WithEndpoint(c.Endpoint))
	}
	if c.Insecure {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	if len(headers) > 0 {
		opts = append(opts, otlptracehttp.WithHeaders(headers))
	}
	return otlptracehttp.New(ctx, opts...)
}

// parseHeaders reads "k1=v1,k2=v2", the OTEL_EXPORTER_OTLP_HEADERS format:
// values are percent-decoded as the SDK decodes that variable, so a value
// copied from a vendor's instructions ("Basic%20...") works in both.
// Errors never quote the value: it holds credentials.
func parseHeaders(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	h := make(map[string]string)
	for i, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if k = strings.TrimSpace(k); !ok || k == "" {
			return nil, fmt.Errorf("headers: entry %d is not key=value", i+1)
		}
		v = strings.TrimSpace(v)
		dv, err := url.PathUnescape(v)
		if err != nil {
			return nil, fmt.Errorf("headers: the value of entry %d (%s) is not percent-encoded properly", i+1, k)
		}
		h[k] = dv
	}
	return h, nil
}

// Tracer returns the tracer the proxy starts its spans with
// (proxy.Options.Tracer).
func (t *Tracer) Tracer() trace.Tracer { return t.tracer }

// Dropped returns the spans dropped so far: because the export queue was
// full, and because their export failed.
func (t *Tracer) Dropped() (queueFull, exportFailed uint64) {
	return t.proc.queueFull.Load(), t.proc.exportFailed.Load()
}

// ForceFlush exports every span ended so far, waiting at most until ctx
// ends.
func (t *Tracer) ForceFlush(ctx context.Context) error { return t.provider.ForceFlush(ctx) }

// Shutdown ends the pipeline: what is queued is exported, within ctx.
// Call it after the last request has finished.
func (t *Tracer) Shutdown(ctx context.Context) error { return t.provider.Shutdown(ctx) }

// droppedDesc describes tollgate_tracing_dropped_spans_total.
var droppedDesc = prometheus.NewDesc("tollgate_tracing_dropped_spans_total",
	"Finished spans that were never exported, by reason: queue_full (the export queue was full) "+
		"or export_failed (the collector refused them, was down or too slow).",
	[]string{"reason"}, nil)

// Collector returns the Prometheus collector of
// tollgate_tracing_dropped_spans_total, to register beside the gateway's
// metrics.
func (t *Tracer) Collector() prometheus.Collector { return droppedCollector{t} }

type droppedCollector struct{ t *Tracer }

func (c droppedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- droppedDesc }

func (c droppedCollector) Collect(ch chan<- prometheus.Metric) {
	full, failed := c.t.Dropped()
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(full), "queue_full")
	ch <- prometheus.MustNewConstMetric(droppedDesc, prometheus.CounterValue, float64(failed), "export_failed")
}
