package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/tollgate-llm/tollgate/internal/jsonscan"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// errorCaptureLimit bounds the copy of an upstream error body kept to read
// its error type.
const errorCaptureLimit = 64 << 10

// copyAnswer relays an answer that is not an event stream on a dialect
// route: a non-streamed answer, or any answer on a forwarded path. A
// non-streamed answer's usage is read from a bounded copy of its body.
func (ex *exchange) copyAnswer(ctx context.Context, at *attemptState, resp *http.Response) attemptResult {
	g := ex.g
	if ex.filtersModelList(resp) {
		return ex.copyModelList(ctx, at, resp)
	}
	s := stop{stage: stageBody, ctx: ctx}
	if isEventStream(resp.Header.Get("Content-Type")) { // a stream on a forwarded path
		ex.sseHeaders()
		s.err, s.writeErr = ex.copyBody(at, resp.StatusCode, resp.Body, 0, true)
		e := ex.classify(at, s)
		ex.ended(e)
		return ex.result(e, resp.StatusCode, true)
	}
	at.learned.form = formWhole // answered in one piece, whatever was asked
	metered := ex.kind.readsUsage()
	limit := 0
	switch {
	case metered:
		limit = ex.gen.cfg.Server.MaxEventBytes
	case at.claim != storedNone: // a conversation created: its id is read
		limit = errorCaptureLimit
	}
	s.err, s.writeErr = ex.copyBody(at, resp.StatusCode, resp.Body, limit, resp.ContentLength < 0 && ex.rec.Dialect == llm.DialectNone)
	s.conflict = at.idConflict
	s.notJSON = !s.conflict && s.err == nil && s.writeErr == nil && resp.StatusCode == http.StatusOK &&
		ex.rec.Dialect != llm.DialectNone && len(at.captured) < limit && !isJSON(at.captured)
	var answer sseparse.ResponsesAnswer // usage and status, in one walk
	if ex.rec.Dialect == llm.DialectResponses {
		answer = sseparse.ReadResponsesAnswer(at.captured)
		if s.failed = resp.StatusCode == http.StatusOK && !s.notJSON && answer.Failed; s.failed {
			s.errType = string(jsonscan.AppendUnescape(nil, answer.Code))
		}
	}
	e := ex.classify(at, s)
	if ex.stored.release && e.outcome == llm.OutcomeOK && resp.StatusCode/100 == 2 {
		ex.releaseStored()
	}
	// Usage is read from an answer that came whole, success or not.
	if metered && (e.outcome == llm.OutcomeOK || e.errType == "invalid_json" || s.conflict ||
		s.failed && e.result == resultErrorEvent) {
		if len(at.captured) >= limit {
			g.log.Warn("answer larger than max_event_bytes: usage not read", "request_id", ex.rec.RequestID,
				"upstream", at.up.cfg.Name, "limit_bytes", limit)
		}
		ex.usageFromBody(at, &answer)
	}
	ex.ended(e)
	if s.conflict {
		ex.fail(errStoredIDConflict(), e.outcome)
	}
	return ex.result(e, resp.StatusCode, true)
}

// copyBody copies a body that is not relayed event by event: non-streamed
// answers, upstream errors and forwarded paths. It keeps up to capture bytes
// in at.captured (for usage or the error type); a larger body is still
// copied whole. status is the upstream answer's, sent to the caller as its
// own. flush sends every read on at once (streams on forwarded paths). It
// returns the upstream's read error and the caller's write error.
func (ex *exchange) copyBody(at *attemptState, status int, body io.Reader, capture int, flush bool) (readErr, writeErr error) {
	g := ex.g
	bp := g.bufPool.Get().(*[]byte)
	defer g.bufPool.Put(bp)
	buf := *bp
	rc := http.NewResponseController(ex.w)
	if (at.claim != storedNone || at.link) && status == http.StatusOK && capture > 0 {
		// The answer names a new stored object: hold it until the object
		// is recorded as the caller's, so the caller never holds an id
		// its team cannot use yet.
		if readErr = at.captureHead(body, buf, capture); readErr == nil && ex.claimAnswer(at, at.captured) {
			// Withheld whole; copyAnswer answers instead.
			at.idConflict = true
			return nil, nil
		}
		ex.writeHeader(status)
		if writeErr = ex.write(at.captured); writeErr == nil && flush {
			writeErr = rc.Flush()
		}
		if readErr != nil || writeErr != nil {
			at.captured = nil
			return readErr, writeErr
		}
	} else {
		ex.writeHeader(status)
	}
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if capture > 0 && len(at.captured) < capture {
				at.captured = append(at.captured, buf[:min(n, capture-len(at.captured))]...)
			}
			if writeErr = ex.write(buf[:n]); writeErr == nil && flush {
				writeErr = rc.Flush()
			}
			if writeErr != nil {
				break
			}
		}
		if err != nil {
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	if (readErr != nil || writeErr != nil) && at.captured != nil && capture > len(at.captured) {
		at.captured = nil // a partial body has no usable usage
	}
	return readErr, writeErr
}

// captureHead reads body into at.captured until capture bytes or its end
// (through buf); it returns the read error, nil at the end.
func (at *attemptState) captureHead(body io.Reader, buf []byte, capture int) error {
	for len(at.captured) < capture {
		n, err := body.Read(buf[:min(len(buf), capture-len(at.captured))])
		at.captured = append(at.captured, buf[:n]...)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// usageFromBody reads the usage of a non-streamed answer from the bounded
// copy of its body (at.captured); a Responses API answer's was read already
// (answer).
func (ex *exchange) usageFromBody(at *attemptState, answer *sseparse.ResponsesAnswer) {
	captured := at.captured
	var u llm.Usage
	var ok bool
	switch ex.rec.Dialect {
	case llm.DialectOpenAI:
		u, ok = sseparse.UsageFromOpenAIBody(captured)
	case llm.DialectAnthropic:
		u, ok = sseparse.UsageFromAnthropicBody(captured)
	case llm.DialectResponses:
		u, ok = answer.Usage, answer.HasUsage
		if len(answer.IncompleteReason) > 0 {
			at.learned.incompleteReason = string(jsonscan.AppendUnescape(nil, answer.IncompleteReason))
		}
	default: // a metered forwarded answer: prompt_tokens or input_tokens
		if u, ok = sseparse.UsageFromOpenAIBody(captured); !ok {
			u, ok = sseparse.UsageFromAnthropicBody(captured)
		}
	}
	at.learned.usage, at.learned.hasUsage = u, ok
}

// isJSON reports whether an answer body is one JSON value, as
// encoding/json.Valid does: jsonscan.Value, ten times faster and held to the
// same verdict by jsonscan's fuzzer, answers first; only a body it refuses
// (malformed, or nested deeper than jsonscan.MaxDepth) is asked again.
func isJSON(body []byte) bool {
	if _, ok := jsonscan.Value(body); ok {
		return true
	}
	return json.Valid(body)
}
