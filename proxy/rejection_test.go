package proxy

import (
	"testing"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/ratelimit"
)

// TestRejectionOf: every limit kind is recorded under the name the
// ratelimit_rejections_total metric gives it, so /stats and the metrics
// agree.
func TestRejectionOf(t *testing.T) {
	for k := ratelimit.KindRPM; k <= ratelimit.KindCostPerMonth; k++ {
		r := rejectionOf(k)
		if r == llm.RejectNone || r == llm.RejectOther || r.String() != k.String() {
			t.Errorf("kind %s recorded as %q", k, r)
		}
	}
	if r := rejectionOf(ratelimit.Kind(200)); r != llm.RejectOther {
		t.Errorf("unknown kind recorded as %q", r)
	}
}
