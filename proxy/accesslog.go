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

// logRecord writes the access-log line of one request. It never carries the
// caller's key, only its hash id. probe marks the gateway's own synthetic
// probe requests ("probe": true), whose upstream and model are the target.
func logRecord(l *slog.Logger, rec *llm.Record, probe bool) {
	attrs := make([]slog.Attr, 0, 32)
	if probe {
		attrs = append(attrs, slog.Bool("probe", true))
	}
	attrs = append(attrs,
		slog.String("request_id", rec.RequestID),
		slog.String("key_id", rec.KeyID),
		slog.String("route", rec.Route.String()),
	)
	if rec.Model != "" {
		attrs = append(attrs, slog.String("model", rec.Model))
	}
	if rec.Upstream != "" {
		attrs = append(attrs, slog.String("upstream", rec.Upstream))
	}
	attrs = append(attrs,
		slog.Bool("stream", rec.Stream),
		slog.Int("status", rec.Status),
		slog.String("outcome", rec.Outcome.String()),
		slog.Float64("e2e_ms", ms(rec.E2E())),
		slog.Float64("overhead_ms", ms(rec.Overhead())),
		slog.Int64("bytes_out", rec.BytesOut),
	)
	if rec.Team != "" {
		attrs = append(attrs, slog.String("team", rec.Team))
	}
	if rec.UpstreamRequestID != "" {
		attrs = append(attrs, slog.String("upstream_request_id", rec.UpstreamRequestID))
	}
	if rec.TraceID != "" {
		attrs = append(attrs, slog.String("trace_id", rec.TraceID))
	}
	if rec.Stream {
		attrs = streamAttrs(attrs, rec)
	}
	attrs = tokenAttrs(attrs, rec)
	attrs = append(attrs, slog.String("input_bucket", rec.InputBucket), slog.String("goodput", rec.Goodput.String()))
	if rec.Interruption != llm.InterruptNone {
		attrs = append(attrs, slog.String("interruption", rec.Interruption.String()))
	}
	if rec.Rejection != llm.RejectNone {
		attrs = append(attrs, slog.String("rejection", rec.Rejection.String()))
	}
	if rec.Outcome != llm.OutcomeOK {
		attrs = append(attrs, slog.String("error_type", errorType(rec)))
	}
	if rec.IncompleteReason != "" {
		attrs = append(attrs, slog.String("incomplete_reason", rec.IncompleteReason))
	}
	attrs = attemptAttrs(attrs, rec)
	l.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs...)
}

// streamAttrs adds a stream's figures: TTFT, upstream TTFT, token events,
// TPOT and ITL.
func streamAttrs(attrs []slog.Attr, rec *llm.Record) []slog.Attr {
	if !rec.Timing.FirstTokenOut.IsZero() {
		attrs = append(attrs, slog.Float64("ttft_ms", ms(rec.TTFT())))
	}
	if !rec.Timing.FirstToken.IsZero() && !rec.Timing.UpSent.IsZero() {
		attrs = append(attrs, slog.Float64("upstream_ttft_ms", ms(rec.UpstreamTTFT())))
	}
	attrs = append(attrs,
		slog.Int("token_events", rec.TokenEvents),
		slog.Bool("terminal_seen", rec.TerminalSeen),
	)
	if tpot, ok := rec.TPOT(); ok {
		attrs = append(attrs, slog.Float64("tpot_ms", ms(tpot)))
	}
	if rec.ITLCount > 0 {
		attrs = append(attrs,
			slog.Float64("itl_mean_ms", ms(rec.ITLSum/time.Duration(rec.ITLCount))),
			slog.Float64("itl_max_ms", ms(rec.ITLMax)))
	}
	return attrs
}

// tokenAttrs adds the tokens and their cost.
func tokenAttrs(attrs []slog.Attr, rec *llm.Record) []slog.Attr {
	if rec.Usage.HasInput {
		attrs = append(attrs,
			slog.Int64("input_tokens", rec.Usage.Input),
			slog.Int64("cache_read_tokens", rec.Usage.CacheRead),
			slog.Int64("cache_write_tokens", rec.Usage.CacheWrite),
		)
		if rec.InputEstimated {
			attrs = append(attrs, slog.Bool("input_estimated", true))
		}
	}
	if rec.Usage.HasOutput || rec.Estimated {
		attrs = append(attrs,
			slog.Int64("output_tokens", rec.Usage.Output),
			slog.Int64("reasoning_tokens", rec.Usage.Reasoning),
			slog.Bool("tokens_estimated", rec.Estimated),
		)
	}
	if rec.CostMicros > 0 {
		attrs = append(attrs, slog.Int64("cost_micros", rec.CostMicros))
	}
	return attrs
}

// attemptAttrs adds the upstream attempts and the time spent waiting
// between and before them.
func attemptAttrs(attrs []slog.Attr, rec *llm.Record) []slog.Attr {
	if rec.AttemptCount > 0 {
		attrs = append(attrs, slog.Int("attempt_count", rec.AttemptCount), slog.Any("attempts", attemptsJSON{rec}))
	}
	if rec.RetryWait > 0 {
		attrs = append(attrs, slog.Float64("retry_wait_ms", ms(rec.RetryWait)))
	}
	if rec.QueueWait > 0 {
		attrs = append(attrs, slog.Float64("queue_wait_ms", ms(rec.QueueWait)))
	}
	return attrs
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
