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

// charge is what a finished exchange is billed: the usage as the record
// keeps it, with what the upstream did not report estimated and flagged
// (so the token metrics, /stats and the access log count what the ledger
// does), the usage billed, and its cost.
type charge struct {
	ok bool // the exchange is billed at all
	// usage is the record's usage; estimated: its Output is max_tokens
	// for want of any usage; inputEstimated: its Input is the prompt
	// estimate.
	usage                     llm.Usage
	estimated, inputEstimated bool
	billed                    llm.Usage // usage, its output counted as reported
	cost                      int64     // micro-dollars, 0 when unpriced
}

// chargeFor returns what the exchange whose record is rec is billed: the
// upstream's usage when it answered successfully (a cancelled stream is
// billed for what was relayed before the cut: output counted from events,
// input from the upstream's usage or else the prompt estimate), nothing
// otherwise.
func (ex *exchange) chargeFor(rec *llm.Record) charge {
	if !ex.kind.billed() || rec.Timing.UpFirstByte.IsZero() || rec.Status < 200 || rec.Status >= 300 {
		// Not a model call (a background response streamed again was
		// billed as its creation, or not at all), or the upstream did not
		// answer with one: an upstream error or a caller gone before the
		// answer is not billed.
		return charge{}
	}
	c := charge{ok: true, usage: rec.Usage}
	u := &c.usage
	if (rec.Outcome == llm.OutcomeUpstreamError || rec.Outcome == llm.OutcomeUpstreamTimeout) &&
		rec.TokenEvents == 0 && !u.HasInput && !u.HasOutput {
		// A stream the upstream failed before any token and any usage (an
		// error event, a break, a stall), or a non-streamed answer that
		// broke or is not JSON: a 200 carrying what would otherwise be an
		// error answer, and not billed, as that is not.
		return charge{}
	}
	if ex.kind == kindMetered && !u.HasInput && !u.HasOutput {
		// A forwarded answer that reports no usage (speech, an
		// assistants run, usage beyond the capture limit) is billed its
		// estimate, never nothing.
		u.Output, c.estimated = max(ex.info.MaxTokens, 0), true
	}
	if !u.HasInput {
		u.Input, u.HasInput, c.inputEstimated = max(ex.promptEstimate, 0), true, true
	}
	c.billed = *u
	c.billed.HasOutput = true
	c.cost, _ = ex.gen.gov.prices.Cost(rec.Model, c.billed)
	return c
}

// settle bills a finished exchange (rec, charged c): it settles its lease
// with the real usage and adds the usage and cost to the spend ledger. It
// runs once, from finish.
func (ex *exchange) settle(rec *llm.Record, c charge) {
	gv := ex.gen.gov
	if ex.lease != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ex.r.Context()), settleTimeout)
		err := gv.limiter.Settle(ctx, ex.lease, satAdd(c.billed.Input, c.billed.Output), c.cost)
		cancel()
		if err != nil {
			ex.g.log.Warn("settling a rate-limit lease", "request_id", rec.RequestID, "key_id", rec.KeyID,
				"err", err)
		}
	}
	if c.ok && gv.ledger != nil {
		day := rec.Timing.In.UTC().Format(time.DateOnly)
		// The admission time lets an in-process ledger's journal restore
		// the rate buckets after a restart; without a lease, the arrival.
		admitted := rec.Timing.In
		if ex.lease != nil {
			admitted = ex.lease.At
		}
		gv.ledger.Add(spend.Key{Day: day, KeyID: rec.KeyID, Team: rec.Team, Model: rec.Model},
			spend.TotalsFor(c.billed, c.cost), admitted)
	}
}

// satAdd adds two non-negative int64s, saturating.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
