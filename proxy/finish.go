package proxy

import (
	"time"
)

// finish completes the record and hands it to the sinks, once per request,
// after the last byte has been written. The probe's record goes to the
// access log alone (marked "probe"): it is kept out of the user figures,
// and settle bills nothing that is not kind.billed.
func (ex *exchange) finish() {
	g, rec := ex.g, &ex.rec
	rec.Timing.End = ex.end()
	if rec.Status == 0 {
		rec.Status = statusClientClosed
	}
	ex.settle()
	input := ex.promptEstimate
	if rec.Usage.HasInput {
		input = rec.Usage.Input
	}
	rec.InputBucket = g.metrics.Buckets().Label(input)
	rec.Goodput = ex.gen.slo.Classify(rec)
	caller := ex.kind.caller()
	if caller {
		label := ex.modelLabel // "" for a request refused before it had one
		if label == "" {
			label = g.metrics.Model(rec.Model)
		}
		ex.recordTurn()
		g.metrics.Observe(rec, label)
		if g.stats != nil {
			g.stats.Observe(rec, label)
		}
	}
	if g.accessLog != nil {
		logRecord(g.accessLog, rec, !caller)
	}
	if caller {
		ex.endTrace()
		if g.onRecord != nil {
			g.onRecord(rec)
		}
	}
}

// end is t_end: the last flush when the caller got the whole answer up to
// its terminal marker (the relay may read on after it, waiting for the
// upstream's end of body), else now, when the exchange ends.
func (ex *exchange) end() time.Time {
	if ex.last.terminalOut {
		return ex.last.lastFlush
	}
	return ex.g.now()
}
