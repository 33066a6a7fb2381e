package jsonlog

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// both writes r through slog's JSON handler and through ours, with opts.
func both(t testing.TB, opts *slog.HandlerOptions, r slog.Record) (want, got string) {
	t.Helper()
	var a, b bytes.Buffer
	if err := slog.NewJSONHandler(&a, opts).Handle(context.Background(), r); err != nil {
		t.Fatalf("slog: %v", err)
	}
	if err := NewHandler(&b, opts).Handle(context.Background(), r); err != nil {
		t.Fatalf("jsonlog: %v", err)
	}
	return a.String(), b.String()
}

var at = time.Date(2026, 12, 2, 11, 27, 41, 921865967, time.UTC)

// awkward strings: every escape slog makes, invalid UTF-8, separators.
var awkward = []string{"", "plain", `quo"te`, `back\slash`, "new\nline\r\t", "\x00\x01\x1f\x7f", "<a&b>",
	"caf\u00e9 \u65e5\u672c", "\xff\xfe bad", "line\u2028sep\u2029para", "emoji \U0001F600", "trunc\xe2\x82"}

// awkward floats: both sides of encoding/json's %e thresholds, signs, zero.
var floats = []float64{0, math.Copysign(0, -1), 1, -1, 0.1, 12.345, 1e-6, 9.99e-7, 1e-7, 1.5e-9, 1e20, 1e21, 123456789e13,
	-3.2e-12, math.MaxFloat64, math.SmallestNonzeroFloat64, 2.5e-10}

// TestSameLinesAsSlog: for records of every kind the fast path takes, and
// those it hands on, the line is byte for byte slog's JSON handler's.
func TestSameLinesAsSlog(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	randomAttr := func(i int) slog.Attr {
		key := "k" + awkward[rng.IntN(len(awkward))]
		switch rng.IntN(12) {
		case 0:
			return slog.String(key, awkward[rng.IntN(len(awkward))])
		case 1:
			return slog.Int64(key, rng.Int64()-math.MaxInt64/2)
		case 2:
			return slog.Uint64(key, rng.Uint64())
		case 3:
			return slog.Bool(key, rng.IntN(2) == 0)
		case 4:
			return slog.Float64(key, floats[rng.IntN(len(floats))])
		case 5:
			return slog.Float64(key, rng.NormFloat64()*math.Pow(10, float64(rng.IntN(50)-25)))
		case 6:
			return slog.Duration(key, time.Duration(rng.Int64N(1e12)))
		case 7:
			return slog.Group(key, slog.Int("n", i), slog.String("s", "v"))
		case 8:
			return slog.Any(key, errors.New("an error"))
		case 9:
			return slog.Time(key, at.Add(time.Duration(i)*time.Millisecond))
		case 10:
			return slog.Any(key, rawJSON(`[{"upstream":"u\"1","status":200,"ms":1.5}]`))
		default:
			return slog.Attr{}
		}
	}
	for i := range 3000 {
		msg := awkward[i%len(awkward)]
		r := slog.NewRecord(at, slog.Level(rng.IntN(16)-8), msg, 0)
		if i%7 == 0 {
			r.Time = time.Time{}
		}
		for j := range rng.IntN(40) {
			r.AddAttrs(randomAttr(j))
		}
		want, got := both(t, nil, r)
		if got != want {
			t.Fatalf("record %d:\nslog    %s\njsonlog %s", i, want, got)
		}
	}
	special := slog.NewRecord(at, slog.LevelInfo, "special", 0)
	special.AddAttrs(slog.Float64("nan", math.NaN()), slog.Float64("inf", math.Inf(1)))
	if want, got := both(t, nil, special); got != want {
		t.Errorf("NaN and Inf:\nslog    %s\njsonlog %s", want, got)
	}
}

// TestOptionsAndDerivedHandlersAsSlog: the level, ReplaceAttr, With and
// WithGroup behave as slog's JSON handler does.
func TestOptionsAndDerivedHandlersAsSlog(t *testing.T) {
	r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
	r.AddAttrs(slog.String("route", "chat"), slog.Float64("e2e_ms", 12.5))
	upper := &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		a.Key = strings.ToUpper(a.Key)
		return a
	}}
	if want, got := both(t, upper, r); got != want {
		t.Errorf("ReplaceAttr:\nslog    %s\njsonlog %s", want, got)
	}
	var lv slog.LevelVar
	lv.Set(slog.LevelWarn)
	h := NewHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: &lv})
	if h.Enabled(context.Background(), slog.LevelInfo) || !h.Enabled(context.Background(), slog.LevelError) {
		t.Error("level warn: info enabled or error not")
	}
	lv.Set(slog.LevelDebug)
	if !h.Enabled(context.Background(), slog.LevelDebug) {
		t.Error("the level var moved to debug, debug not enabled")
	}
	var a, b bytes.Buffer
	_ = slog.NewJSONHandler(&a, nil).WithAttrs([]slog.Attr{slog.String("svc", "gw")}).WithGroup("g").Handle(context.Background(), r)
	_ = NewHandler(&b, nil).WithAttrs([]slog.Attr{slog.String("svc", "gw")}).WithGroup("g").Handle(context.Background(), r)
	if a.String() != b.String() {
		t.Errorf("With and WithGroup:\nslog    %s\njsonlog %s", a.String(), b.String())
	}
}

// FuzzSameLinesAsSlog: any string as message, key and value, and any
// float, gives slog's line.
func FuzzSameLinesAsSlog(f *testing.F) {
	for i, s := range awkward {
		f.Add(s, s+"k", floats[i%len(floats)], int64(i))
	}
	f.Fuzz(func(t *testing.T, s, key string, x float64, n int64) {
		r := slog.NewRecord(at, slog.LevelInfo, s, 0)
		r.AddAttrs(slog.String(key, s), slog.Float64("f", x), slog.Int64("n", n), slog.Bool(s, n%2 == 0))
		if want, got := both(t, nil, r); got != want {
			t.Fatalf("\nslog    %s\njsonlog %s", want, got)
		}
	})
}

// accessLine is a record shaped like the gateway's access-log line.
func accessLine() slog.Record {
	r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
	r.AddAttrs(slog.String("request_id", "01JD9W3N5KQ8Z7XG2M4T6V8B0C"), slog.String("key_id", "3f2a9c1b7e4d5a60"),
		slog.String("route", "chat_completions"), slog.String("model", "gpt-4o-mini"), slog.String("upstream", "openai"),
		slog.Bool("stream", true), slog.Int("status", 200), slog.String("outcome", "ok"),
		slog.Float64("e2e_ms", 2188.071), slog.Float64("overhead_ms", 0.412), slog.Int64("bytes_out", 18234),
		slog.String("team", "search"), slog.String("upstream_request_id", "req_abc123"),
		slog.Float64("ttft_ms", 206.57), slog.Float64("upstream_ttft_ms", 205.9), slog.Int("token_events", 100),
		slog.Bool("terminal_seen", true), slog.Float64("tpot_ms", 20.01), slog.Float64("itl_mean_ms", 20.05),
		slog.Float64("itl_max_ms", 22.44), slog.Int64("input_tokens", 42), slog.Int64("cache_read_tokens", 0),
		slog.Int64("cache_write_tokens", 0), slog.Int64("output_tokens", 100), slog.Float64("cost_usd", 0.0000663),
		slog.String("input_bucket", "short"), slog.String("goodput", "good"),
		slog.Int("attempt_count", 1), slog.Any("attempts", rawJSON(`[{"upstream":"openai","status":200,"result":"ok","ms":2187.9}]`)))
	return r
}

// rawJSON is an Appender that holds its compact JSON.
type rawJSON string

func (r rawJSON) AppendJSON(b []byte) []byte   { return append(b, r...) }
func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// TestAppenderTakesTheFastPath: a value of kind Any that writes its own
// JSON is written by the fast path; any other one goes to slog's handler.
func TestAppenderTakesTheFastPath(t *testing.T) {
	if _, ok := appendRecord(nil, accessLine()); !ok {
		t.Error("the access line, its attempts an Appender, went to slog's handler")
	}
	r := slog.NewRecord(at, slog.LevelInfo, "request", 0)
	r.AddAttrs(slog.Any("attempts", []int{1}))
	if _, ok := appendRecord(nil, r); ok {
		t.Error("a slice of kind Any took the fast path")
	}
}

// BenchmarkAccessLine: one access-log line through slog's JSON handler and
// through this one, to a discarding writer.
func BenchmarkAccessLine(b *testing.B) {
	r := accessLine()
	for _, c := range []struct {
		name string
		h    slog.Handler
	}{{"slog", slog.NewJSONHandler(discard{}, nil)}, {"jsonlog", NewHandler(discard{}, nil)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.h.Handle(context.Background(), r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
