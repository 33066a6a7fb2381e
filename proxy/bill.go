package proxy

import (
	"context"
	"math"
	"time"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/spend"
)

// settleTimeout bounds the Settle of a lease after the response is done. The
// caller's context may be gone by then (a cancelled stream must still be
// settled), so Settle runs without its cancellation.
const settleTimeout = 2 * time.Second

// billable returns the usage the exchange is billed for: the upstream's
// usage when it answered successfully (a cancelled stream is billed for what
// was relayed before the cut: output counted from events, input from the
// upstream's usage or else the prompt estimate), nothing otherwise. What it
// estimates it writes on the record too, flagged (InputEstimated,
// Estimated), so the token metrics, /stats and the access log count what
// the ledger does.
func (ex *exchange) billable() (llm.Usage, bool) {
	rec := &ex.rec
	if !ex.kind.billed() || rec.Timing.UpFirstByte.IsZero() || rec.Status < 200 || rec.Status >= 300 {
		// Not a model call (a background response streamed again was
		// billed as its creation, or not at all), or the upstream did not
		// answer with one: an upstream error or a caller gone before the
		// answer is not billed.
		return llm.Usage{}, false
	}
	u := &rec.Usage
	if (rec.Outcome == llm.OutcomeUpstreamError || rec.Outcome == llm.OutcomeUpstreamTimeout) &&
		rec.TokenEvents == 0 && !u.HasInput && !u.HasOutput {
		// A stream the upstream failed before any token and any usage (an
		// error event, a break, a stall), or a non-streamed answer that
		// broke or is not JSON: a 200 carrying what would otherwise be an
		// error answer, and not billed, as that is not.
		return llm.Usage{}, false
	}
	if ex.kind == kindMetered && !u.HasInput && !u.HasOutput {
		// A forwarded answer that reports no usage (speech, an
		// assistants run, usage beyond the capture limit) is billed its
		// estimate, never nothing.
		u.Output, rec.Estimated = max(ex.info.MaxTokens, 0), true
	}
	if !u.HasInput {
		u.Input, u.HasInput, rec.InputEstimated = max(ex.promptEstimate, 0), true, true
	}
	billed := *u
	billed.HasOutput = true
	return billed, true
}

// settle bills a finished exchange: it settles its lease with the real usage
// and adds the usage and cost to the spend ledger. It runs once, from finish.
func (ex *exchange) settle() {
	gv := ex.gen.gov
	u, ok := ex.billable()
	var cost int64
	if ok {
		cost, _ = gv.prices.Cost(ex.rec.Model, u)
		ex.rec.CostMicros = cost
	}
	if ex.lease != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.r.Context()), settleTimeout)
		err := gv.limiter.Settle(ctx, ex.lease, satAdd(u.Input, u.Output), cost)
		cancel()
		if err != nil {
			ex.g.log.Warn("settling a rate-limit lease", "request_id", ex.rec.RequestID, "key_id", ex.rec.KeyID,
				"err", err)
		}
	}
	if ok && gv.ledger != nil {
		day := ex.rec.Timing.In.UTC().Format(time.DateOnly)
		// The admission time lets an in-process ledger's journal restore
		// the rate buckets after a restart; without a lease, the arrival.
		admitted := ex.rec.Timing.In
		if ex.lease != nil {
			admitted = ex.lease.At
		}
		gv.ledger.Add(spend.Key{Day: day, KeyID: ex.rec.KeyID, Team: ex.rec.Team, Model: ex.rec.Model},
			spend.TotalsFor(u, cost), admitted)
	}
}

// satAdd adds two non-negative int64s, saturating.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
