package spend

import (
	"math"
	"math/big"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/llm"
)

// price is a [[models]] table written with decimal strings, so the test's
// expected costs come from exact decimals, not from the float64 the config
// holds. An empty cache price is left out of the table.
type price struct {
	pattern, in, out, cacheRead, cacheWrite string
}

func (p price) model(t testing.TB) config.Model {
	t.Helper()
	f := func(s string) float64 {
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	m := config.Model{Pattern: p.pattern, InputUSDPerMTok: f(p.in), OutputUSDPerMTok: f(p.out)}
	if p.cacheRead != "" {
		v := f(p.cacheRead)
		m.CacheReadUSDPerMTok = &v
	}
	if p.cacheWrite != "" {
		v := f(p.cacheWrite)
		m.CacheWriteUSDPerMTok = &v
	}
	return m
}

// roundHalfUp rounds a non-negative rational to the nearest integer, halves
// up.
func roundHalfUp(r *big.Rat) *big.Int {
	x := new(big.Rat).Add(r, big.NewRat(1, 2))
	return new(big.Int).Quo(x.Num(), x.Denom())
}

// picoOf is the spec's price per token: USD/Mtok × 1e6 pico-dollars,
// rounded to an integer.
func picoOf(t testing.TB, usdPerMTok string) *big.Int {
	r, ok := new(big.Rat).SetString(usdPerMTok)
	if !ok {
		t.Fatalf("bad price %q", usdPerMTok)
	}
	return roundHalfUp(r.Mul(r, big.NewRat(1_000_000, 1)))
}

// wantMicros computes the cost independently of Cost, with big integers:
// Σ tokens × pico-dollars per token, then rounded to micro-dollars.
func wantMicros(t testing.TB, p price, u llm.Usage) *big.Int {
	t.Helper()
	cr, cw := p.cacheRead, p.cacheWrite
	if cr == "" {
		cr = p.in
	}
	if cw == "" {
		cw = p.in
	}
	pos := func(n int64) *big.Int { return big.NewInt(max(n, 0)) }
	uncached := new(big.Int).Sub(pos(u.Input), pos(u.CacheRead))
	uncached.Sub(uncached, pos(u.CacheWrite))
	if uncached.Sign() < 0 {
		uncached.SetInt64(0)
	}
	sum := new(big.Int)
	for _, part := range []struct {
		tokens *big.Int
		price  string
	}{{uncached, p.in}, {pos(u.CacheRead), cr}, {pos(u.CacheWrite), cw}, {pos(u.Output), p.out}} {
		sum.Add(sum, new(big.Int).Mul(part.tokens, picoOf(t, part.price)))
	}
	return roundHalfUp(new(big.Rat).SetFrac(sum, big.NewInt(1_000_000)))
}

func TestCost(t *testing.T) {
	gpt := price{pattern: "gpt-4o*", in: "2.5", out: "10", cacheRead: "1.25"}
	claude := price{pattern: "claude-sonnet-4-*", in: "3", out: "15", cacheRead: "0.3", cacheWrite: "3.75"}
	nocache := price{pattern: "plain", in: "0.15", out: "0.6"}
	half := price{pattern: "half", in: "0.5", out: "0.499999"}
	huge := price{pattern: "huge", in: "1000000", out: "1000000", cacheRead: "999999.999999", cacheWrite: "0.000001"}
	tiny := price{pattern: "tiny", in: "0.0000004", out: "0.0000005"} // 0.4 and 0.5 pico-dollars per token
	prices := []price{gpt, claude, nocache, half, huge, tiny}
	models := make([]config.Model, len(prices))
	for i, p := range prices {
		models[i] = p.model(t)
	}
	ps := NewPrices(models)

	tests := []struct {
		name  string
		model string
		p     price
		u     llm.Usage
	}{
		{"input and output", "gpt-4o-2024-08-06", gpt, llm.Usage{Input: 1234, Output: 567}},
		{"cache read", "gpt-4o", gpt, llm.Usage{Input: 10000, CacheRead: 8000, Output: 10}},
		{"nil cache write price is the input price", "gpt-4o", gpt, llm.Usage{Input: 10000, CacheWrite: 4000, Output: 1}},
		{"cache read and write", "claude-sonnet-4-5", claude, llm.Usage{Input: 50000, CacheRead: 30000, CacheWrite: 15000, Output: 2000}},
		{"reasoning is in output, not added", "claude-sonnet-4-5", claude, llm.Usage{Input: 10, Output: 1000, Reasoning: 900}},
		{"cache beyond input: uncached is 0", "claude-sonnet-4-5", claude, llm.Usage{Input: 100, CacheRead: 80, CacheWrite: 80}},
		{"no cache prices at all", "plain", nocache, llm.Usage{Input: 7777, CacheRead: 5000, CacheWrite: 1000, Output: 333}},
		{"zero usage", "plain", nocache, llm.Usage{}},
		{"negative counts are 0", "plain", nocache, llm.Usage{Input: -5, Output: -7, CacheRead: -1}},
		{"half rounds up", "half", half, llm.Usage{Input: 1}},
		{"below half rounds down", "half", half, llm.Usage{Output: 1}},
		{"1.5 rounds up", "half", half, llm.Usage{Input: 3}},
		{"sum rounded once", "half", half, llm.Usage{Input: 1, Output: 1}},
		{"tiny prices round to the pico-dollar", "tiny", tiny, llm.Usage{Input: 1e12, Output: 1e12}},
		{"huge", "huge", huge, llm.Usage{Input: 1e12, Output: 1e12}},
		{"huge with cache", "huge", huge, llm.Usage{Input: 1e12, CacheRead: 4e11, CacheWrite: 3e11, Output: 1e12}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, priced := ps.Cost(tt.model, tt.u)
			want := wantMicros(t, tt.p, tt.u)
			if !priced || !want.IsInt64() || got != want.Int64() {
				t.Fatalf("Cost(%q, %+v) = %d, %v; want %s, true", tt.model, tt.u, got, priced, want)
			}
		})
	}
}

func TestCostUnpriced(t *testing.T) {
	ps := NewPrices([]config.Model{{Pattern: "gpt-4o*", InputUSDPerMTok: 1, OutputUSDPerMTok: 1}})
	for _, m := range []string{"gpt-4", "", "o1", "xgpt-4o"} {
		if got, priced := ps.Cost(m, llm.Usage{Input: 100, Output: 100}); priced || got != 0 {
			t.Errorf("Cost(%q) = %d, %v; want 0, false", m, got, priced)
		}
	}
	if got, priced := NewPrices(nil).Cost("gpt-4o", llm.Usage{Input: 1}); priced || got != 0 {
		t.Errorf("no models: Cost = %d, %v; want 0, false", got, priced)
	}
	// A malformed pattern matches nothing rather than panicking.
	bad := NewPrices([]config.Model{{Pattern: "[", InputUSDPerMTok: 1}})
	if _, priced := bad.Cost("[", llm.Usage{Input: 1}); priced {
		t.Error("malformed pattern priced a model")
	}
}

func TestCostFirstMatchWins(t *testing.T) {
	mini := config.Model{Pattern: "gpt-4o-mini*", InputUSDPerMTok: 0.15, OutputUSDPerMTok: 0.6}
	full := config.Model{Pattern: "gpt-4o*", InputUSDPerMTok: 2.5, OutputUSDPerMTok: 10}
	u := llm.Usage{Input: 1_000_000, Output: 1_000_000}
	const miniCost, fullCost = 750_000, 12_500_000 // µ$ for 1 Mtok in and out

	specificFirst := NewPrices([]config.Model{mini, full})
	if got, _ := specificFirst.Cost("gpt-4o-mini-2024-07-18", u); got != miniCost {
		t.Errorf("mini first: mini costs %d, want %d", got, miniCost)
	}
	if got, _ := specificFirst.Cost("gpt-4o-2024-08-06", u); got != fullCost {
		t.Errorf("mini first: 4o costs %d, want %d", got, fullCost)
	}
	generalFirst := NewPrices([]config.Model{full, mini})
	if got, _ := generalFirst.Cost("gpt-4o-mini-2024-07-18", u); got != fullCost {
		t.Errorf("4o first: mini costs %d, want %d (the first match)", got, fullCost)
	}
}

func TestCostSaturates(t *testing.T) {
	ps := NewPrices([]config.Model{{Pattern: "*", InputUSDPerMTok: 1e6, OutputUSDPerMTok: 1e6}})
	u := llm.Usage{Input: math.MaxInt64, Output: math.MaxInt64}
	want := wantMicros(t, price{in: "1000000", out: "1000000"}, u)
	if want.IsInt64() {
		t.Fatalf("test case does not overflow: %s", want)
	}
	if got, priced := ps.Cost("m", u); !priced || got != math.MaxInt64 {
		t.Fatalf("Cost = %d, %v; want MaxInt64, true", got, priced)
	}
}

func TestNewPricesBadValues(t *testing.T) {
	neg, nan, inf := -1.0, math.NaN(), math.Inf(1)
	ps := NewPrices([]config.Model{{Pattern: "*", InputUSDPerMTok: neg, OutputUSDPerMTok: nan,
		CacheReadUSDPerMTok: &inf, CacheWriteUSDPerMTok: &neg}})
	got, _ := ps.Cost("m", llm.Usage{Input: 10, Output: 10, CacheWrite: 5})
	if got != 0 {
		t.Errorf("negative and NaN prices cost %d, want 0", got)
	}
	got, _ = ps.Cost("m", llm.Usage{Input: 2e6, CacheRead: 1e6})
	// +Inf is clamped to MaxInt64 pico-dollars per token.
	want := new(big.Int).Mul(big.NewInt(1e6), big.NewInt(math.MaxInt64))
	want = roundHalfUp(new(big.Rat).SetFrac(want, big.NewInt(1e6)))
	if !want.IsInt64() || got != want.Int64() {
		t.Errorf("infinite cache price: cost %d, want %s", got, want)
	}
}

// TestCostRandom compares Cost with the big-integer computation on random
// prices (up to 1e6 USD/Mtok, six decimals) and usage (up to 1e12 tokens).
func TestCostRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dec := func() string {
		micro := rng.Int64N(1_000_000_000_000) // up to 1e6 USD/Mtok in millionths
		return strconv.FormatInt(micro/1_000_000, 10) + "." + strconv.FormatInt(1_000_000+micro%1_000_000, 10)[1:]
	}
	for i := range 2000 {
		p := price{pattern: "*", in: dec(), out: dec()}
		if i%2 == 0 {
			p.cacheRead = dec()
		}
		if i%3 == 0 {
			p.cacheWrite = dec()
		}
		u := llm.Usage{Input: rng.Int64N(1e12), Output: rng.Int64N(1e12)}
		u.CacheRead = rng.Int64N(u.Input/2 + 1)
		u.CacheWrite = rng.Int64N(u.Input/2 + 1)
		got, _ := NewPrices([]config.Model{p.model(t)}).Cost("m", u)
		want := wantMicros(t, p, u)
		if !want.IsInt64() || got != want.Int64() {
			t.Fatalf("prices %+v usage %+v: Cost = %d, want %s", p, u, got, want)
		}
	}
}

func TestTotalsFor(t *testing.T) {
	u := llm.Usage{Input: 1, Output: 2, CacheRead: 3, CacheWrite: 4, Reasoning: 5}
	want := Totals{Requests: 1, Input: 1, Output: 2, CacheRead: 3, CacheWrite: 4, Reasoning: 5, CostMicros: 6}
	if got := TotalsFor(u, 6); got != want {
		t.Fatalf("TotalsFor = %+v, want %+v", got, want)
	}
	var sum Totals
	sum.Add(want)
	sum.Add(want)
	if sum.Requests != 2 || sum.CostMicros != 12 || sum.Reasoning != 10 || sum.CacheWrite != 8 {
		t.Fatalf("Add twice = %+v", sum)
	}
}
