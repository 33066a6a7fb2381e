package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/tollgate-llm/tollgate/config"
)

// turnFrames is one turn's server messages: response.created, events
// output_text deltas, response.completed with its usage.
func turnFrames(events int) [][]byte {
	f := [][]byte{[]byte(`{"type":"response.created","sequence_number":0,"response":{"id":"resp_b","object":"response","status":"in_progress","model":"gpt-test","output":[],"usage":null}}`)}
	for i := range events {
		f = append(f, fmt.Appendf(nil, `{"type":"response.output_text.delta","sequence_number":%d,"item_id":"msg_b","output_index":0,"content_index":0,"delta":" tok%d"}`, i+1, i))
	}
	return append(f, fmt.Appendf(nil, `{"type":"response.completed","sequence_number":%d,"response":{"id":"resp_b","object":"response","status":"completed","model":"gpt-test","output":[],"usage":{"input_tokens":12,"output_tokens":%d,"total_tokens":%d}}}`,
		events+1, events, events+12))
}

// frameUpstream answers every message on a socket with frames.
func frameUpstream(frames [][]byte) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			if _, _, err := c.Read(r.Context()); err != nil {
				return
			}
			for _, m := range frames {
				if c.Write(r.Context(), websocket.MessageText, m) != nil {
					return
				}
			}
		}
	}))
}

// BenchmarkSocketRelay runs turns of 64 token events over one socket,
// directly to a scripted upstream and through the gateway, on loopback in
// one process: what the gateway adds per event is the difference of the
// two (ns/event, and allocations per turn over its 66 events).
func BenchmarkSocketRelay(b *testing.B) {
	const events = 64
	frames := turnFrames(events)
	up := frameUpstream(frames)
	defer up.Close()
	g := bareGateway(b, up.URL, func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	gw := httptest.NewServer(g.Handler())
	defer gw.Close()
	create := []byte(`{"type":"response.create","model":"gpt-test","input":"hi","store":false}`)
	for _, target := range []struct{ name, url string }{{"direct", up.URL}, {"gateway", gw.URL}} {
		b.Run(target.name, func(b *testing.B) {
			ctx := context.Background()
			c, _, err := websocket.Dial(ctx, target.url+"/v1/responses", nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.CloseNow()
			c.SetReadLimit(1 << 20)
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if err := c.Write(ctx, websocket.MessageText, create); err != nil {
					b.Fatal(err)
				}
				for range frames {
					if _, _, err := c.Read(ctx); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-ms/1000turns")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(frames)), "ns/event")
			c.Close(websocket.StatusNormalClosure, "")
		})
	}
}

// heldSockets opens n sockets to url, idle (no turn), and returns the
// memory in use with them open; then it closes them and waits until their
// goroutines are gone.
func heldSockets(b *testing.B, url string, n int) heldMemory {
	b.Helper()
	ctx := context.Background()
	g0 := runtime.NumGoroutine()
	conns := make([]*websocket.Conn, 0, n)
	for range n {
		c, _, err := websocket.Dial(ctx, url+"/v1/responses", nil)
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
	}
	m := settledMemory()
	for _, c := range conns {
		_ = c.CloseNow()
	}
	for i := 0; runtime.NumGoroutine() > g0+4; i++ { // bounded: 10 s
		if i == 1000 {
			b.Fatalf("%d goroutines left after closing the sockets, %d before", runtime.NumGoroutine(), g0)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return m
}

// BenchmarkHeldSocketMemory reports the gateway's Go memory per open, idle
// Responses WebSocket: heap, stacks and goroutines with 200 sockets open
// through the gateway, less the same with 200 open directly to the
// upstream (client and upstream share the process), divided by 200.
func BenchmarkHeldSocketMemory(b *testing.B) {
	const n = 200
	up := frameUpstream(turnFrames(1))
	defer up.Close()
	g := bareGateway(b, up.URL, func(c *config.Config) { c.Upstreams[0].ResponsesWebSocket = true })
	gw := httptest.NewServer(g.Handler())
	defer gw.Close()
	var per heldMemory
	for b.Loop() {
		direct := heldSockets(b, up.URL, n)
		via := heldSockets(b, gw.URL, n)
		d := via.minus(direct)
		per = heldMemory{d.heap / n, d.stack / n, d.goroutines / n}
	}
	b.ReportMetric(per.heap, "heap-B/socket")
	b.ReportMetric(per.stack, "stack-B/socket")
	b.ReportMetric(per.heap+per.stack, "B/socket")
	b.ReportMetric(per.goroutines, "goroutines/socket")
}
