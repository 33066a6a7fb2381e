package proxy

import (
	"context"
	"log/slog"
	"strconv"
	"time"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
)

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// logRecord writes the access-log line of one request: the fields of
// recordFields the record has, in order. It never carries the caller's
// key, only its hash id. probe marks the gateway's own synthetic probe
// requests ("probe": true), whose upstream and model are the target.
func logRecord(l *slog.Logger, rec *llm.Record, probe bool) {
	attrs := make([]slog.Attr, 0, 32)
	if probe {
		attrs = append(attrs, slog.Bool(probeField, true))
	}
	for i := range recordFields {
		f := &recordFields[i]
		if f.present == nil || f.present(rec) {
			attrs = append(attrs, slog.Attr{Key: f.log, Value: f.value(rec)})
		}
	}
	l.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// attemptsJSON writes a record's upstream attempts as the access log's
// "attempts" array, one object per attempt: the upstream, its status (0
// when it sent none or was skipped), the result ("ok" or why it failed or
// was skipped), how long it took in ms, and breaker_bypass (only when
// true) for an attempt sent although the upstream's breaker refused it.
// It writes its own JSON (jsonlog.Appender) so the line takes the log's
// fast path and the list costs no allocation. Strings are escaped as slog
// escapes them (jsonscan.AppendString), which writes a backspace or form
// feed as \u0008 or \u000c where encoding/json writes \b or \f; upstream
// names (config allows [a-z0-9_-]) and results never hold either.
type attemptsJSON struct{ rec *llm.Record }

// AppendJSON appends the array to b.
func (a attemptsJSON) AppendJSON(b []byte) []byte {
	b = append(b, '[')
	for i, at := range a.rec.Attempts[:min(a.rec.AttemptCount, llm.MaxRecordedAttempts)] {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"upstream":`...)
		b = jsonscan.AppendString(b, at.Upstream)
		b = append(b, `,"status":`...)
		b = strconv.AppendInt(b, int64(at.Status), 10)
		b = append(b, `,"result":`...)
		b = jsonscan.AppendString(b, at.Result)
		b = append(b, `,"ms":`...)
		b = jsonscan.AppendFloat(b, ms(at.Duration))
		if at.BreakerBypass {
			b = append(b, `,"breaker_bypass":true`...)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// MarshalJSON is AppendJSON, for slog's JSON handler.
func (a attemptsJSON) MarshalJSON() ([]byte, error) { return a.AppendJSON(nil), nil }

// MarshalText is AppendJSON too, for slog's text handler ([log] format =
// "text"), which would otherwise print the struct.
func (a attemptsJSON) MarshalText() ([]byte, error) { return a.AppendJSON(nil), nil }
