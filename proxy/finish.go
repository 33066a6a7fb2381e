package proxy

import (
	"time"

	"github.com/tollgate-llm/tollgate/llm"
)

// finish completes the record and hands it to the sinks, once per request,
// after the last byte has been written. The probe's record goes to the
// access log alone (marked "probe"): it is kept out of the user figures,
// and settle bills nothing that is not kind.billed. It returns the finished
// record (the probe reads its result there).
func (ex *exchange) finish() *llm.Record {
	g, rec := ex.g, &ex.rec
	ex.closeRecord()
	c := ex.chargeFor(rec)
	if c.ok {
		rec.Usage, rec.CostMicros = c.usage, c.cost
		rec.Estimated = rec.Estimated || c.estimated
		rec.InputEstimated = c.inputEstimated
	}
	ex.settle(rec, c)
	input := ex.promptEstimate
	if rec.Usage.HasInput {
		input = rec.Usage.Input
	}
	rec.InputBucket = g.metrics.Buckets().Label(input)
	rec.Population = ex.population(rec)
	if rec.Population == llm.PopRefused && rec.Rejection == llm.RejectNone {
		rec.Rejection = llm.RejectionOfStatus(rec.Status)
	}
	rec.Goodput = ex.gen.slo.Classify(rec)
	caller := ex.kind.caller()
	if caller {
		label := ex.modelLabel // "" for a request refused before it had one
		if label == "" {
			label = g.metrics.Model(rec.Model)
		}
		ex.recordTurn(rec)
		g.metrics.Observe(rec, label)
		if g.stats != nil {
			g.stats.Observe(rec, label)
		}
	}
	if g.accessLog != nil {
		logRecord(g.accessLog, rec, !caller)
	}
	if caller {
		ex.endTrace(rec)
		if g.onRecord != nil {
			g.onRecord(rec)
		}
	}
	return rec
}

// population is the one place that decides which requests a finished
// record is counted among (llm.Population): the probe's own; a request the
// gateway answered itself with an error before any upstream attempt
// (outcome rejected or bad_request), refused; a request on a model route
// that was not, a model call (whether the upstream then answered it well
// or not); any other request, a forward.
func (ex *exchange) population(rec *llm.Record) llm.Population {
	switch {
	case ex.kind == kindProbe:
		return llm.PopProbe
	case rec.AttemptCount == 0 && (rec.Outcome == llm.OutcomeRejected || rec.Outcome == llm.OutcomeBadRequest):
		return llm.PopRefused
	}
	switch rec.Route {
	case llm.RouteChatCompletions, llm.RouteMessages, llm.RouteResponses:
		return llm.PopModelCall
	}
	return llm.PopForward
}

// closeRecord completes the record from what the request's stages handed
// back as values: the last attempt's facts (lastAttempt().learned), the round
// trip's (ex.trip), and the reply's (ex.out); then t_end. The front door
// wrote the request's own part (key, team, model, the stream asked for, a
// refusal's reason) as it checked it. An attempt that is not the last one
// leaves nothing on the record but its line in the attempt log.
func (ex *exchange) closeRecord() {
	rec, out := &ex.rec, ex.out
	if at := ex.lastAttempt(); at.up != nil {
		l := &at.learned
		rec.Upstream, rec.UpstreamRequestID = at.up.cfg.Name, l.requestID
		rec.Timing.UpSent, rec.Timing.UpFirstByte, rec.Timing.FirstTokenOut = l.sent, l.firstByte, l.firstTokenOut
		rec.RelayOverhead = l.relayOverhead
		switch l.form {
		case formStream:
			rec.Stream = true
		case formWhole:
			rec.Stream = false
		}
		if l.tallied {
			l.tally.Fill(rec)
		}
		if l.hasUsage {
			rec.Usage = l.usage
		}
		if l.incompleteReason != "" {
			rec.IncompleteReason = l.incompleteReason
		}
	}
	rec.AttemptLog = ex.trip.AttemptLog
	rec.Retrying, rec.RetryWait, rec.QueueWait = ex.trip.retrying, ex.trip.retryWait, ex.trip.queueWait
	if out.usage.HasInput || out.usage.HasOutput {
		rec.Usage = out.usage
	}
	rec.Status, rec.BytesOut = out.status, out.bytes
	if !out.sent() {
		rec.Status = statusClientClosed
	}
	rec.Outcome, rec.Interruption = out.outcome, out.interrupt
	if out.errType != "" {
		rec.ErrorType = out.errType
	}
	rec.Timing.End = ex.end()
	rec.Timing.HeadersOut = out.headersAt
	rec.Conversation, rec.ConversationSource = ex.conv.key, ex.conv.source
	if rec.Conversation == "" {
		rec.ConversationSource = ""
	}
	rec.RequestClass, rec.Agent = ex.info.agent.hints.Class, ex.info.agent.hints.Agent
}

// end is t_end: the last flush when the caller got the whole answer up to
// its terminal marker (the relay may read on after it, waiting for the
// upstream's end of body), else now, when the exchange ends.
func (ex *exchange) end() time.Time {
	if at := ex.lastAttempt(); at.terminalOut {
		return at.lastFlush
	}
	return ex.g.now()
}
