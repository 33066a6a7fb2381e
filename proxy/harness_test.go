package proxy

import (
	"bytes"
	"cmp"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/metrics"
	"github.com/tollgate-llm/tollgate/spend"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testGateway is a gateway on a loopback httptest server, with the records it
// finished.
type testGateway struct {
	URL      string
	gw       *Gateway
	srv      *httptest.Server
	registry *prometheus.Registry
	logs     *bytes.Buffer // access log
	mu       sync.Mutex
	recs     []llm.Record
	recCh    chan llm.Record
}

// newTestGateway starts a gateway in front of upstreamURL. edit may change
// the config before the gateway is built.
func newTestGateway(t *testing.T, upstreamURL string, edit func(*config.Config)) *testGateway {
	t.Helper()
	return newTestGatewayWith(t, upstreamURL, edit, nil)
}

// newTestGatewayWith is newTestGateway with a hook that may set more
// Options (a limiter, a ledger, a clock) before the gateway is built.
func newTestGatewayWith(t *testing.T, upstreamURL string, edit func(*config.Config), opts func(*Options)) *testGateway {
	t.Helper()
	cfg := config.DemoConfig(upstreamURL)
	cfg.Auth.RequireKey = false
	if edit != nil {
		edit(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("config: %v", err)
	}
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	tg := &testGateway{registry: reg, logs: &bytes.Buffer{}, recCh: make(chan llm.Record, 1024)}
	var logMu sync.Mutex
	access := slog.New(slog.NewJSONHandler(lockedWriter{&logMu, tg.logs}, nil))
	o := Options{
		Config: &cfg, Metrics: m, Gatherer: reg,
		Logger:    slog.New(slog.DiscardHandler),
		AccessLog: access,
		OnRecord: func(r *llm.Record) {
			tg.mu.Lock()
			tg.recs = append(tg.recs, *r)
			tg.mu.Unlock()
			tg.recCh <- *r
		},
	}
	if opts != nil {
		opts(&o)
	}
	gw, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	tg.gw = gw
	tg.srv = httptest.NewServer(gw.Handler())
	tg.URL = tg.srv.URL
	t.Cleanup(func() {
		tg.srv.Close()
		for _, u := range gw.upstreams {
			if tr, ok := u.transport.(*http.Transport); ok {
				tr.CloseIdleConnections()
			}
		}
	})
	return tg
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// record waits for the next finished record.
func (tg *testGateway) record(t *testing.T) llm.Record {
	t.Helper()
	select {
	case r := <-tg.recCh:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no record within 10s")
		return llm.Record{}
	}
}

// post sends a JSON body and returns the response with its whole body read.
func post(t *testing.T, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading body: %v", err)
	}
	return resp, b
}

// rawUpstream serves body verbatim as an SSE stream, writing it in the given
// pieces (flushing after each), and records the request it got.
type rawUpstream struct {
	pieces      [][]byte
	contentType string
	status      int // 200 when 0
	mu          sync.Mutex
	lastBody    []byte
	lastHeader  http.Header
}

func (u *rawUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.lastBody, u.lastHeader = b, r.Header.Clone()
	u.mu.Unlock()
	ct := u.contentType
	if ct == "" {
		ct = "text/event-stream"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(cmp.Or(u.status, http.StatusOK))
	rc := http.NewResponseController(w)
	for _, p := range u.pieces {
		if _, err := w.Write(p); err != nil {
			return
		}
		_ = rc.Flush()
	}
}

func (u *rawUpstream) request() ([]byte, http.Header) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lastBody, u.lastHeader
}

// newLocalLedger returns an in-memory spend ledger closed in t.Cleanup.
func newLocalLedger(t testing.TB) *spend.Local {
	t.Helper()
	l, err := spend.NewLocal(spend.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// bareGateway builds a Gateway (no server, no access log) in front of
// upstreamURL; edit may change the config first.
func bareGateway(tb testing.TB, upstreamURL string, edit func(*config.Config)) *Gateway {
	tb.Helper()
	cfg := config.DemoConfig(upstreamURL)
	cfg.Auth.RequireKey = false
	if edit != nil {
		edit(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	m, err := metrics.New(prometheus.NewRegistry(), &cfg)
	if err != nil {
		tb.Fatal(err)
	}
	g, err := New(Options{Config: &cfg, Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		for _, u := range g.upstreams {
			if tr, ok := u.transport.(*http.Transport); ok {
				tr.CloseIdleConnections()
			}
		}
	})
	return g
}
