package spend

import (
	"math"
	"math/bits"
	"path"
	"strings"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// picoPerMicro is the number of pico-dollars in a micro-dollar.
const picoPerMicro = 1_000_000

// modelPrice is one [[models]] table with its prices in integer pico-dollars
// per token (USD per million tokens × 1e6).
type modelPrice struct {
	pattern string
	// prefix is the pattern's literal start, before any of *?[\, so most
	// non-matching models are skipped without path.Match.
	prefix                               string
	input, output, cacheRead, cacheWrite uint64
}

// Prices prices usage with the [[models]] tables. It is immutable and safe
// for concurrent use.
type Prices struct {
	models []modelPrice
}

// NewPrices converts the [[models]] tables, in order, to integer prices of
// pico-dollars per token, rounded to the nearest pico-dollar. Config
// validation rejects bad prices; should one get through anyway, a negative
// or NaN price counts as 0 and a price above math.MaxInt64 pico-dollars as
// that maximum, rather than as an arbitrary conversion result.
func NewPrices(models []config.Model) *Prices {
	p := &Prices{models: make([]modelPrice, 0, len(models))}
	for _, m := range models {
		mp := modelPrice{
			pattern: m.Pattern,
			prefix:  m.Pattern,
			input:   picoPerToken(m.InputUSDPerMTok),
			output:  picoPerToken(m.OutputUSDPerMTok),
		}
		if i := strings.IndexAny(m.Pattern, `*?[\`); i >= 0 {
			mp.prefix = m.Pattern[:i]
		}
		mp.cacheRead, mp.cacheWrite = mp.input, mp.input
		if m.CacheReadUSDPerMTok != nil {
			mp.cacheRead = picoPerToken(*m.CacheReadUSDPerMTok)
		}
		if m.CacheWriteUSDPerMTok != nil {
			mp.cacheWrite = picoPerToken(*m.CacheWriteUSDPerMTok)
		}
		p.models = append(p.models, mp)
	}
	return p
}

// picoPerToken converts US dollars per million tokens to pico-dollars per
// token: 1 USD/Mtok = 1e-6 USD/token = 1e6 pico-dollars/token.
func picoPerToken(usdPerMTok float64) uint64 {
	p := usdPerMTok * 1e6
	switch {
	case !(p > 0): // also NaN
		return 0
	case p >= math.MaxInt64: // float64(MaxInt64) is 2^63
		return math.MaxInt64
	}
	return uint64(math.Round(p))
}

// Cost returns the cost of u for model in micro-dollars, and whether a
// [[models]] pattern priced it (the first that matches, as path.Match
// decides). Uncached input (Input − CacheRead − CacheWrite, never below 0) is
// priced at the input price, cache reads and writes at theirs, and Output
// (reasoning included) at the output price. The sum is exact, in 128-bit
// pico-dollars, and rounded once to the nearest micro-dollar, halves up.
// Negative token counts count as 0; a cost above math.MaxInt64 micro-dollars
// (impossible with real usage) is reported as math.MaxInt64.
func (p *Prices) Cost(model string, u llm.Usage) (micros int64, priced bool) {
	m := p.match(model)
	if m == nil {
		return 0, false
	}
	in, cr, cw := nonNeg(u.Input), nonNeg(u.CacheRead), nonNeg(u.CacheWrite)
	uncached := in - min(in, cr)
	uncached -= min(uncached, cw)

	// Each product is below 2^126 (both factors are below 2^63), so the sum
	// of four plus the rounding half cannot overflow 128 bits.
	var s u128
	s.addMul(uncached, m.input)
	s.addMul(cr, m.cacheRead)
	s.addMul(cw, m.cacheWrite)
	s.addMul(nonNeg(u.Output), m.output)
	s.add(picoPerMicro / 2)
	if s.hi >= picoPerMicro { // the quotient would not fit 64 bits
		return math.MaxInt64, true
	}
	q, _ := bits.Div64(s.hi, s.lo, picoPerMicro)
	if q > math.MaxInt64 {
		return math.MaxInt64, true
	}
	return int64(q), true
}

// match returns the first model price whose pattern matches model, or nil.
func (p *Prices) match(model string) *modelPrice {
	for i := range p.models {
		m := &p.models[i]
		if !strings.HasPrefix(model, m.prefix) {
			continue
		}
		// A malformed pattern matches nothing; config validation reports it.
		if ok, _ := path.Match(m.pattern, model); ok {
			return m
		}
	}
	return nil
}

// TotalsFor returns the ledger counters of one request with usage u and
// cost costMicros.
func TotalsFor(u llm.Usage, costMicros int64) Totals {
	return Totals{
		Requests:   1,
		Input:      u.Input,
		Output:     u.Output,
		CacheRead:  u.CacheRead,
		CacheWrite: u.CacheWrite,
		Reasoning:  u.Reasoning,
		CostMicros: costMicros,
	}
}

func nonNeg(n int64) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

// u128 is an unsigned 128-bit accumulator.
type u128 struct{ hi, lo uint64 }

func (s *u128) add(n uint64) {
	var c uint64
	s.lo, c = bits.Add64(s.lo, n, 0)
	s.hi += c
}

func (s *u128) addMul(a, b uint64) {
	hi, lo := bits.Mul64(a, b)
	var c uint64
	s.lo, c = bits.Add64(s.lo, lo, 0)
	s.hi += hi + c
}
