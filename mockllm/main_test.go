package mockllm_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tollgate-llm/tollgate/mockllm"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// waitTimeout bounds every wait in these tests; it is a deadlock guard, not
// a timing assertion.
const waitTimeout = 10 * time.Second

// start serves a mock on loopback for the test's lifetime.
func start(t *testing.T, opts mockllm.Options) (*mockllm.Server, *httptest.Server) {
	t.Helper()
	m := mockllm.New(opts)
	ts := httptest.NewServer(m)
	t.Cleanup(ts.Close)
	return m, ts
}

// post sends body to path with the given headers (pairs of name, value).
func post(t *testing.T, ts *httptest.Server, path, body string, hdr ...string) *http.Response {
	t.Helper()
	return do(t, waitCtx(t), ts, http.MethodPost, path, body, hdr...)
}

func do(t *testing.T, ctx context.Context, ts *httptest.Server, method, path, body string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// event is one SSE event as framed on the wire.
type event struct {
	name string // the event: line, "" when absent
	data string
}

// readEvents frames an SSE body (the mock writes LF line ends) and returns
// the events and the read error, if the body broke.
func readEvents(r io.Reader) ([]event, error) {
	var evs []event
	var cur event
	var hasData bool
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if hasData {
				evs = append(evs, cur)
			}
			cur, hasData = event{}, false
		case strings.HasPrefix(line, "event: "):
			cur.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			if hasData {
				cur.data += "\n"
			}
			cur.data += strings.TrimPrefix(line, "data: ")
			hasData = true
		}
	}
	return evs, sc.Err()
}

// readAllEvents reads the body to its end and fails the test if it broke.
func readAllEvents(t *testing.T, resp *http.Response) []event {
	t.Helper()
	evs, err := readEvents(resp.Body)
	if err != nil {
		t.Fatalf("reading the stream: %v", err)
	}
	return evs
}

// obj decodes a JSON object into a generic map.
func obj(t *testing.T, s string) map[string]any {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	return m
}

// path walks a decoded JSON value by keys and array indexes ("0").
func path(v any, keys ...string) any {
	for _, k := range keys {
		switch x := v.(type) {
		case map[string]any:
			v = x[k]
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i >= len(x) {
				return nil
			}
			v = x[i]
		default:
			return nil
		}
	}
	return v
}

// num returns a decoded json.Number as int64, or -1.
func num(v any) int64 {
	n, ok := v.(json.Number)
	if !ok {
		return -1
	}
	i, err := n.Int64()
	if err != nil {
		return -1
	}
	return i
}

// words builds the expected text independently of the package: prefix+i
// for i in [from, to].
func words(prefix string, from, to int) string {
	var b strings.Builder
	for i := from; i <= to; i++ {
		b.WriteString(prefix + strconv.Itoa(i))
	}
	return b.String()
}

// baseTokens is the documented input count: ceil(len(body)/4).
func baseTokens(body []byte) int64 {
	n := int64(len(body)) / 4
	if len(body)%4 != 0 {
		n++
	}
	return n
}

// lastBody returns the body of the last request the mock recorded on path.
func lastBody(t *testing.T, m *mockllm.Server, p string) []byte {
	t.Helper()
	recs := m.Requests()
	for i := len(recs) - 1; i >= 0; i-- {
		if recs[i].Path == p {
			return recs[i].Body
		}
	}
	t.Fatalf("no request recorded on %s", p)
	return nil
}

// waitCtx returns a context bounded by waitTimeout.
func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	t.Cleanup(cancel)
	return ctx
}
