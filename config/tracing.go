package config

import (
	"net"
	"net/url"
	"strings"
	"time"
)

// Tracing is the [tracing] table: OpenTelemetry traces of every request,
// with the GenAI semantic conventions, exported over OTLP (package
// tracing). Off by default. It is read at start only: a reload does not
// change it.
type Tracing struct {
	// Enabled turns tracing on. Default false.
	Enabled bool `toml:"enabled"`
	// Protocol is the OTLP transport: "http/protobuf" (OTLP/HTTP) or
	// "grpc", the values of OTEL_EXPORTER_OTLP_PROTOCOL. Default
	// "http/protobuf".
	Protocol string `toml:"protocol"`
	// Endpoint is the collector: "host:port" or a URL ("http://host:4318",
	// "https://host:4317"; with OTLP/HTTP a URL's path replaces
	// /v1/traces). Empty: the exporter's own setting, from
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT,
	// else localhost:4318 (HTTP) or localhost:4317 (gRPC). Default "".
	Endpoint string `toml:"endpoint"`
	// Insecure sends to a "host:port" endpoint without TLS (an http:// URL
	// is plain text by itself). Default false.
	Insecure bool `toml:"insecure"`
	// HeadersEnv names an environment variable holding headers sent with
	// every export, as "key1=value1,key2=value2", values percent-decoded
	// (the format of OTEL_EXPORTER_OTLP_HEADERS, which the exporters also
	// read by themselves). Default "": none beyond OTEL_EXPORTER_OTLP_HEADERS.
	HeadersEnv string `toml:"headers_env"`
	// Headers is what HeadersEnv's variable holds (a secret: collectors take
	// API keys there); read at load, never printed.
	Headers Secret `toml:"-"`
	// SampleRatio is the share of traces started here that are sampled,
	// from 0 to 1. A caller's traceparent decides for its own trace
	// (parent-based sampling). Default 1.
	SampleRatio float64 `toml:"sample_ratio"`
	// ServiceName is the service.name resource attribute. Default
	// "tollgate".
	ServiceName string `toml:"service_name"`
	// CaptureContent exports the request's messages and a non-streamed
	// answer's body (each cut at 16 KiB) on the request's span. They hold
	// whatever the caller and the model wrote. Default false: no content
	// leaves the gateway.
	CaptureContent bool `toml:"capture_content"`
	// QueueSize bounds the spans waiting for export. When it is full a
	// finished span is dropped and counted
	// (tollgate_tracing_dropped_spans_total): the relay never waits for the
	// collector. At least 1. Default 2048.
	QueueSize int `toml:"queue_size"`
	// ExportTimeoutSeconds bounds one export to the collector. Default 10.
	ExportTimeoutSeconds float64 `toml:"export_timeout_seconds"`
}

// Tracing protocols, after OTEL_EXPORTER_OTLP_PROTOCOL.
const (
	TracingHTTP = "http/protobuf"
	TracingGRPC = "grpc"
)

// defaultTracing returns the defaults of the [tracing] table.
func defaultTracing() Tracing {
	return Tracing{
		Protocol:             TracingHTTP,
		SampleRatio:          1,
		ServiceName:          "tollgate",
		QueueSize:            2048,
		ExportTimeoutSeconds: 10,
	}
}

// validateTracing checks the [tracing] table, enabled or not, so that
// turning it on never meets a stale value.
func (c *Config) validateTracing(v *validator) {
	t := &c.Tracing
	if t.Protocol != TracingHTTP && t.Protocol != TracingGRPC {
		v.add("tracing.protocol", "%q is not an OTLP protocol; use %q or %q", t.Protocol, TracingHTTP, TracingGRPC)
	}
	if t.Endpoint != "" && strings.Contains(t.Endpoint, "://") {
		u, err := url.Parse(t.Endpoint)
		switch {
		case err != nil:
			v.add("tracing.endpoint", "%q is not a URL: %v", t.Endpoint, err)
		case u.Scheme != "http" && u.Scheme != "https":
			v.add("tracing.endpoint", "%q: scheme %q is not http or https", t.Endpoint, u.Scheme)
		case u.Host == "":
			v.add("tracing.endpoint", "%q has no host", t.Endpoint)
		case u.Port() != "" && !validPort(u.Port()):
			v.add("tracing.endpoint", "%q: port %q is not a number from 1 to 65535", t.Endpoint, u.Port())
		case t.Insecure && u.Scheme == "https":
			v.add("tracing.insecure", "is true but tracing.endpoint %q is an https URL: drop insecure, or write the endpoint as http://", t.Endpoint)
		}
	} else if t.Endpoint != "" {
		host, port, err := net.SplitHostPort(t.Endpoint)
		if err != nil || host == "" || strings.ContainsAny(t.Endpoint, " /") || !validPort(port) {
			v.add("tracing.endpoint", "%q is neither host:port (a port from 1 to 65535) nor an http(s) URL", t.Endpoint)
		}
	}
	if t.HeadersEnv != "" && v.envVar("tracing.headers_env", t.HeadersEnv, t.Headers, "headers") {
		for _, kv := range strings.Split(t.Headers.Reveal(), ",") {
			if k, _, ok := strings.Cut(kv, "="); !ok || strings.TrimSpace(k) == "" {
				// The value holds credentials: say where, not what.
				v.add("tracing.headers_env", "variable %s must hold key=value pairs separated by commas", t.HeadersEnv)
				break
			}
		}
	}
	v.number("tracing.sample_ratio", t.SampleRatio, 0, 1)
	if t.ServiceName == "" {
		v.add("tracing.service_name", "must not be empty")
	}
	v.atLeast("tracing.queue_size", int64(t.QueueSize), 1)
	// The queue is allocated at start, a slot per span: a typo of a few
	// zeros must not take the memory of the host.
	if t.QueueSize > maxTracingQueue {
		v.add("tracing.queue_size", "%d is over %d spans", t.QueueSize, maxTracingQueue)
	}
	v.duration("tracing.export_timeout_seconds", t.ExportTimeoutSeconds, time.Second, false)
}

// maxTracingQueue bounds [tracing] queue_size.
const maxTracingQueue = 1 << 20
