// Package otlptest is an OTLP trace receiver for tests: a real OTLP/HTTP
// (protobuf) or OTLP/gRPC server on loopback that decodes what it gets with
// the official OTLP protobuf definitions (go.opentelemetry.io/proto/otlp)
// and keeps every span.
package otlptest

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Span is one received span with its resource's attributes.
type Span struct {
	*tracepb.Span
	Resource map[string]any
}

// TraceID and SpanID, ParentID are the span's ids in hex ("" for none).
func (s Span) TraceID() string  { return hex.EncodeToString(s.GetTraceId()) }
func (s Span) SpanID() string   { return hex.EncodeToString(s.GetSpanId()) }
func (s Span) ParentID() string { return hex.EncodeToString(s.GetParentSpanId()) }

// Attrs returns the span's attributes as Go values: string, bool, int64,
// float64 or []any.
func (s Span) Attrs() map[string]any { return attrMap(s.GetAttributes()) }

// Receiver keeps the spans exported to it.
type Receiver struct {
	// Endpoint is the receiver's address: an http:// URL for OTLP/HTTP
	// (its /v1/traces path is the exporter's default), host:port for gRPC.
	Endpoint string

	mu      sync.Mutex
	spans   []Span
	exports int
	arrived chan struct{} // a value per export request received
	stall   chan struct{} // while open, the receiver holds every export
}

func newReceiver() *Receiver {
	return &Receiver{arrived: make(chan struct{}, 1024)}
}

// StartHTTP starts an OTLP/HTTP receiver on loopback, closed at the end of
// the test.
func StartHTTP(tb testing.TB) *Receiver {
	tb.Helper()
	r := newReceiver()
	srv := httptest.NewServer(http.HandlerFunc(r.serveHTTP))
	tb.Cleanup(func() {
		r.Unstall()
		srv.Close()
	})
	r.Endpoint = srv.URL
	return r
}

func (r *Receiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" ||
		req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "not an OTLP/HTTP protobuf trace export", http.StatusBadRequest)
		return
	}
	b, err := io.ReadAll(req.Body)
	if err != nil {
		return
	}
	var msg collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !r.receive(req.Context(), &msg) {
		return
	}
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// StartGRPC starts an OTLP/gRPC receiver on loopback, stopped at the end of
// the test.
func StartGRPC(tb testing.TB) *Receiver {
	tb.Helper()
	r := newReceiver()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := grpc.NewServer()
	collectorpb.RegisterTraceServiceServer(s, grpcService{r: r})
	go func() { _ = s.Serve(ln) }()
	tb.Cleanup(func() {
		r.Unstall()
		s.Stop()
	})
	r.Endpoint = ln.Addr().String()
	return r
}

type grpcService struct {
	collectorpb.UnimplementedTraceServiceServer
	r *Receiver
}

func (g grpcService) Export(ctx context.Context, req *collectorpb.ExportTraceServiceRequest) (*collectorpb.ExportTraceServiceResponse, error) {
	if !g.r.receive(ctx, req) {
		return nil, ctx.Err()
	}
	return &collectorpb.ExportTraceServiceResponse{}, nil
}

// receive keeps msg's spans, after holding the export while the receiver
// is stalled; false when the exporter gave up first.
func (r *Receiver) receive(ctx context.Context, msg *collectorpb.ExportTraceServiceRequest) bool {
	r.mu.Lock()
	stall := r.stall
	r.mu.Unlock()
	select {
	case r.arrived <- struct{}{}:
	default:
	}
	if stall != nil {
		select {
		case <-stall:
		case <-ctx.Done():
			return false
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports++
	for _, rs := range msg.GetResourceSpans() {
		res := attrMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, Span{Span: s, Resource: res})
			}
		}
	}
	return true
}

// Stall makes the receiver hold every export until Unstall (or the end of
// the test): a collector that accepts connections and never answers.
func (r *Receiver) Stall() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stall == nil {
		r.stall = make(chan struct{})
	}
}

// Unstall lets held and later exports through.
func (r *Receiver) Unstall() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stall != nil {
		close(r.stall)
		r.stall = nil
	}
}

// WaitExport waits for an export request to arrive (held or not).
func (r *Receiver) WaitExport(tb testing.TB) {
	tb.Helper()
	select {
	case <-r.arrived:
	case <-time.After(10 * time.Second):
		tb.Fatal("no export reached the receiver in 10 s")
	}
}

// Spans returns the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// attrMap turns OTLP attributes into Go values.
func attrMap(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		m[kv.GetKey()] = value(kv.GetValue())
	}
	return m
}

func value(v *commonpb.AnyValue) any {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_BoolValue:
		return x.BoolValue
	case *commonpb.AnyValue_IntValue:
		return x.IntValue
	case *commonpb.AnyValue_DoubleValue:
		return x.DoubleValue
	case *commonpb.AnyValue_ArrayValue:
		out := make([]any, 0, len(x.ArrayValue.GetValues()))
		for _, e := range x.ArrayValue.GetValues() {
			out = append(out, value(e))
		}
		return out
	}
	return nil
}
