// Package jsonlog is a slog.Handler that writes the same JSON lines as
// slog.NewJSONHandler, faster for flat records: the access log writes one
// line of some thirty strings, numbers and booleans per request, and
// slog's JSON handler formats each float through encoding/json and each
// attribute through a closure, which made the line a tenth of the CPU of a
// short non-streamed request. Records it has no fast path for (groups,
// handler attributes, values of kind Any other than an Appender, other
// kinds, ReplaceAttr, AddSource, NaN) go to an slog.JSONHandler on the
// same writer, so the output is the same either way.
package jsonlog

import (
	"context"
	"io"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
)

// Appender is a value that writes its own JSON: an slog.Any attribute
// holding one takes the fast path, where any other value of kind Any goes
// to slog's handler. Its MarshalJSON, which slog's handler calls, must
// return the same compact bytes (AppendJSON(nil)).
type Appender interface {
	AppendJSON(b []byte) []byte
}

// Handler writes one JSON object per record, one Write per line.
type Handler struct {
	w     io.Writer
	mu    *sync.Mutex // shared with the handlers of With and WithGroup
	opts  slog.HandlerOptions
	slow  slog.Handler // slog's own, for what the fast path does not take
	plain bool         // no ReplaceAttr, no AddSource: the fast path may run
}

// NewHandler is slog.NewJSONHandler(w, opts), with a fast path.
func NewHandler(w io.Writer, opts *slog.HandlerOptions) *Handler {
	if opts == nil {
		opts = &slog.HandlerOptions{}
	}
	mu := &sync.Mutex{}
	return &Handler{
		w: w, mu: mu, opts: *opts,
		slow:  slog.NewJSONHandler(lockedWriter{w, mu}, opts),
		plain: opts.ReplaceAttr == nil && !opts.AddSource,
	}
}

// lockedWriter makes slog's handler and the fast path take turns on w.
type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Enabled reports whether level is at or above the handler's level.
func (h *Handler) Enabled(_ context.Context, level slog.Level) bool {
	lowest := slog.LevelInfo
	if h.opts.Level != nil {
		lowest = h.opts.Level.Level()
	}
	return level >= lowest
}

// WithAttrs and WithGroup return slog's own handler: records with handler
// attributes or groups take no fast path.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler { return h.slow.WithAttrs(attrs) }

// WithGroup is WithAttrs's counterpart for groups.
func (h *Handler) WithGroup(name string) slog.Handler { return h.slow.WithGroup(name) }

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// Handle writes r as one line.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if !h.plain {
		return h.slow.Handle(ctx, r)
	}
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	b, ok := appendRecord((*bp)[:0], r)
	*bp = b
	if !ok {
		return h.slow.Handle(ctx, r)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := h.w.Write(b)
	return err
}

// appendRecord appends r's line; ok is false when an attribute needs
// slog's handler.
func appendRecord(b []byte, r slog.Record) (_ []byte, ok bool) {
	b = append(b, '{')
	if !r.Time.IsZero() {
		if y := r.Time.Year(); y < 0 || y >= 10000 {
			return b, false // slog reports the error in the line
		}
		b = append(b, `"time":"`...)
		b = r.Time.AppendFormat(b, time.RFC3339Nano)
		b = append(b, `",`...)
	}
	b = append(b, `"level":`...)
	b = jsonscan.AppendString(b, r.Level.String())
	b = append(b, `,"msg":`...)
	b = jsonscan.AppendString(b, r.Message)
	ok = true
	r.Attrs(func(a slog.Attr) bool {
		if a.Equal(slog.Attr{}) {
			return true // slog drops empty attributes
		}
		if a.Value.Kind() == slog.KindLogValuer {
			ok = false
			return false
		}
		b = append(b, ',')
		b = jsonscan.AppendString(b, a.Key)
		b = append(b, ':')
		b, ok = appendValue(b, a.Value)
		return ok
	})
	return append(b, "}\n"...), ok
}

func appendValue(b []byte, v slog.Value) ([]byte, bool) {
	switch v.Kind() {
	case slog.KindString:
		return jsonscan.AppendString(b, v.String()), true
	case slog.KindInt64:
		return strconv.AppendInt(b, v.Int64(), 10), true
	case slog.KindUint64:
		return strconv.AppendUint(b, v.Uint64(), 10), true
	case slog.KindBool:
		return strconv.AppendBool(b, v.Bool()), true
	case slog.KindFloat64:
		f := v.Float64()
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return b, false // slog writes the error in the line
		}
		return jsonscan.AppendFloat(b, f), true
	case slog.KindAny:
		if a, ok := v.Any().(Appender); ok {
			return a.AppendJSON(b), true
		}
	}
	return b, false
}
