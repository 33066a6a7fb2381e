package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// DefaultSweepTarget is the goodput ratio a sweep level must reach when
// SweepOptions.Target is zero.
const DefaultSweepTarget = 0.95

// SweepOptions tunes Sweep.
type SweepOptions struct {
	// Target is the goodput ratio (good requests over all requests sent,
	// failures included) a level must reach to pass; zero means
	// DefaultSweepTarget. It must lie in (0, 1].
	Target float64
	// StopAfterBreak ends the sweep after the first level that breaks, so a
	// saturated service is not pushed to the higher levels.
	StopAfterBreak bool
}

// SweepLevel is one concurrency level of a sweep. Latencies are in
// milliseconds over the level's successful requests, and zero without one.
type SweepLevel struct {
	Concurrency           int     `json:"concurrency"`
	Requests              int     `json:"requests"`
	Succeeded             int     `json:"succeeded"`
	RequestsPerSecond     float64 `json:"requests_per_second"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`
	TTFTP50               float64 `json:"ttft_p50_ms"`
	TTFTP99               float64 `json:"ttft_p99_ms"`
	TPOTP50               float64 `json:"tpot_p50_ms"`
	GoodputRatio          float64 `json:"goodput_ratio"`
	Errors                int     `json:"errors"`
	// ErrorKinds breaks Errors down by kind.
	ErrorKinds Errors `json:"error_kinds"`
	// Pass reports whether the level met the sweep's rule; Broke says why
	// not ("goodput" and/or "ttft_p99"), empty when it passed.
	Pass  bool   `json:"pass"`
	Broke string `json:"broke,omitempty"`
	// Result is the level's full run.
	Result *Result `json:"-"`
}

// SweepResult is a concurrency sweep: its levels in the order run, and the
// saturation point found.
type SweepResult struct {
	Levels []SweepLevel `json:"levels"`
	// Saturation is the highest concurrency among the levels run that
	// passed (see Sweep); 0 if none passed.
	Saturation int `json:"saturation"`
	// FirstBreak is the lowest concurrency among the levels run that broke;
	// 0 if none broke.
	FirstBreak int `json:"first_break"`
	// Target is the goodput ratio the levels were held to.
	Target float64 `json:"target"`
	// SLOTTFTMs is the TTFT objective P99 TTFT was held to; 0 when unset.
	SLOTTFTMs float64 `json:"slo_ttft_ms,omitempty"`
	// Info describes the runs (its Requests and Concurrency are the last
	// level's).
	Info Info `json:"info"`
	// Gateway, when set, holds the gateway's own figures for the whole
	// sweep, every level together, beside the client's.
	Gateway *GatewayStats `json:"gateway,omitempty"`
}

// Sweep runs cfg once per concurrency level, in the order given, each with
// cfg.Requests requests at fixed concurrency (Concurrency = level, Rate 0),
// and finds the saturation point.
//
// A level passes when both hold:
//
//   - its goodput ratio (requests that succeeded and met every target of
//     cfg.SLO, over all requests sent, failures included) is at least
//     opt.Target;
//   - when cfg.SLO.TTFT is set, its P99 TTFT (over successful requests) is
//     at most cfg.SLO.TTFT; a level without a success has no P99 and fails
//     the goodput test anyway.
//
// Any other level breaks. Saturation is the highest level that passed, 0 if
// none did; FirstBreak the lowest that broke. With opt.StopAfterBreak no
// level is run after the first that breaks, so Saturation is then the level
// before the break (or 0).
//
// levels must be positive and strictly increasing, cfg.Requests at least the
// highest level (fewer would never reach it), and cfg.Rate zero. An invalid
// argument returns an error without a result. When ctx ends, Sweep returns
// the levels measured so far (the interrupted one included) with an error
// wrapping ctx's.
func Sweep(ctx context.Context, cfg Config, levels []int, opt SweepOptions) (*SweepResult, error) {
	if len(levels) == 0 {
		return nil, fmt.Errorf("bench: sweep: no concurrency levels")
	}
	for i, l := range levels {
		if l <= 0 {
			return nil, fmt.Errorf("bench: sweep: level %d: want a positive concurrency", l)
		}
		if i > 0 && l <= levels[i-1] {
			return nil, fmt.Errorf("bench: sweep: levels %v: want strictly increasing", levels)
		}
	}
	if top := levels[len(levels)-1]; cfg.Requests < top {
		return nil, fmt.Errorf("bench: sweep: %d requests per level cannot reach concurrency %d", cfg.Requests, top)
	}
	if cfg.Rate != 0 {
		return nil, fmt.Errorf("bench: sweep: rate %v: a sweep runs at fixed concurrency, want 0", cfg.Rate)
	}
	if opt.Target == 0 {
		opt.Target = DefaultSweepTarget
	}
	if !(opt.Target > 0 && opt.Target <= 1) {
		return nil, fmt.Errorf("bench: sweep: goodput target %v: want more than 0, at most 1", opt.Target)
	}
	if _, _, err := settle(cfg); err != nil {
		return nil, err
	}

	sr := &SweepResult{Target: opt.Target, SLOTTFTMs: ms(cfg.SLO.TTFT)}
	for _, l := range levels {
		c := cfg
		c.Concurrency = l
		res, err := Run(ctx, c)
		if res == nil {
			return nil, err
		}
		sr.Info = res.Info
		lv := sweepLevel(l, res, cfg, opt.Target)
		sr.add(lv)
		if err != nil {
			return sr, fmt.Errorf("bench: sweep at concurrency %d: %w", l, err)
		}
		if !lv.Pass && opt.StopAfterBreak {
			break
		}
	}
	return sr, nil
}

// add appends a measured level and updates the saturation point: the
// highest level that passed, and the lowest that broke.
func (s *SweepResult) add(lv SweepLevel) {
	s.Levels = append(s.Levels, lv)
	if lv.Pass {
		s.Saturation = lv.Concurrency
	} else if s.FirstBreak == 0 {
		s.FirstBreak = lv.Concurrency
	}
}

// sweepLevel condenses one level's run and applies the rule of Sweep.
func sweepLevel(level int, res *Result, cfg Config, target float64) SweepLevel {
	lv := SweepLevel{Concurrency: level, Result: res}
	all := res.Summary(ClassAll)
	if all == nil {
		lv.Broke = "goodput"
		return lv
	}
	lv.Requests, lv.Succeeded = all.Requests, all.Succeeded
	lv.RequestsPerSecond, lv.OutputTokensPerSecond = all.RequestsPerSecond, all.OutputTokensPerSecond
	lv.TTFTP50, lv.TTFTP99, lv.TPOTP50 = all.TTFT.Median, all.TTFT.P99, all.TPOT.Median
	lv.GoodputRatio = all.Goodput.Ratio
	lv.Errors, lv.ErrorKinds = all.Errors.Total(), all.Errors
	var broke []string
	if lv.GoodputRatio < target {
		broke = append(broke, "goodput")
	}
	if cfg.SLO.TTFT > 0 && (all.TTFT.Count == 0 || lv.TTFTP99 > ms(cfg.SLO.TTFT)) {
		broke = append(broke, "ttft_p99")
	}
	lv.Broke = strings.Join(broke, ",")
	lv.Pass = len(broke) == 0
	return lv
}

// WriteJSON writes the sweep as one JSON object.
func (s *SweepResult) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("bench: writing JSON: %w", err)
	}
	return nil
}

// WriteTable writes the sweep as a table, one row per level, followed by the
// saturation line.
func (s *SweepResult) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s, model %s\n", s.Info.Dialect, s.Info.URL, s.Info.Model)
	fmt.Fprintf(&b, "concurrency sweep, %d requests per level, max tokens %d\n", s.Info.Requests, s.Info.MaxTokens)
	fmt.Fprintf(&b, "pass: %s\n\n", s.rule())
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\trequests/s\toutput tok/s\tTTFT P50 ms\tTTFT P99 ms\tTPOT P50 ms\tgoodput\terrors\tpass\t")
	for i := range s.Levels {
		l := &s.Levels[i]
		pass := "yes"
		if !l.Pass {
			pass = "no (" + l.Broke + ")"
		}
		errs := strconv.Itoa(l.Errors)
		if l.Errors > 0 {
			errs = errorsText(&l.ErrorKinds)
		}
		fmt.Fprintf(tw, "%d\t%.2f\t%.1f\t%.2f\t%.2f\t%.2f\t%.1f%%\t%s\t%s\t\n",
			l.Concurrency, l.RequestsPerSecond, l.OutputTokensPerSecond,
			l.TTFTP50, l.TTFTP99, l.TPOTP50, 100*l.GoodputRatio, errs, pass)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("bench: writing table: %w", err)
	}
	b.WriteByte('\n')
	switch {
	case s.Saturation > 0 && s.FirstBreak > 0:
		fmt.Fprintf(&b, "saturation: concurrency %d (first break at %d)\n", s.Saturation, s.FirstBreak)
	case s.Saturation > 0:
		fmt.Fprintf(&b, "saturation: concurrency %d or more (no level broke)\n", s.Saturation)
	default:
		fmt.Fprintf(&b, "saturation: none (no level passed)\n")
	}
	if s.Gateway != nil {
		if err := s.Gateway.writeTable(&b); err != nil {
			return fmt.Errorf("bench: writing table: %w", err)
		}
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("bench: writing table: %w", err)
	}
	return nil
}

// rule states the pass rule for the table's header.
func (s *SweepResult) rule() string {
	r := fmt.Sprintf("goodput ≥ %.1f%%", 100*s.Target)
	if s.SLOTTFTMs > 0 {
		r += fmt.Sprintf(" and TTFT P99 ≤ %g ms", s.SLOTTFTMs)
	}
	return r
}

// StageError reports the stage at which Stages stopped: the first whose run
// had a failed request.
type StageError struct {
	Stage    int    // 1-based
	Stages   int    // stages planned
	Requests int    // requests of the stage
	Failed   int    // failed requests of the stage
	Errors   Errors // the failures by kind
}

func (e *StageError) Error() string {
	return fmt.Sprintf("bench: stage %d of %d (%d requests): %d failed (%s); later stages not run",
		e.Stage, e.Stages, e.Requests, e.Failed, errorsText(&e.Errors))
}

// Stages runs cfg once per count, in order, each with that many requests
// (in the spirit of "5 requests to check the path, 30 for percentiles, 100
// for goodput"). It stops after the first stage with a failed request and
// returns the results so far, that stage's included, with a *StageError
// naming the stage and its failures. counts must be positive. An invalid
// argument returns an error without results; when ctx ends, the results so
// far come with an error wrapping ctx's.
func Stages(ctx context.Context, cfg Config, counts []int) ([]*Result, error) {
	if len(counts) == 0 {
		return nil, fmt.Errorf("bench: stages: no stage")
	}
	for _, n := range counts {
		if n <= 0 {
			return nil, fmt.Errorf("bench: stages: stage of %d requests: want at least 1", n)
		}
	}
	c := cfg
	c.Requests = counts[0]
	if _, _, err := settle(c); err != nil {
		return nil, err
	}
	var out []*Result
	for i, n := range counts {
		c := cfg
		c.Requests = n
		res, err := Run(ctx, c)
		if res == nil {
			return nil, err
		}
		out = append(out, res)
		if err != nil {
			return out, fmt.Errorf("bench: stage %d of %d: %w", i+1, len(counts), err)
		}
		if all := res.Summary(ClassAll); all != nil && all.Failed > 0 {
			return out, &StageError{Stage: i + 1, Stages: len(counts), Requests: n,
				Failed: all.Failed, Errors: all.Errors}
		}
	}
	return out, nil
}

// WriteStagesTable writes each stage's table under a stage header, then,
// when gw is not nil, the gateway's figures for all the stages beside the
// client's.
func WriteStagesTable(w io.Writer, stages []*Result, gw *GatewayStats) error {
	for i, r := range stages {
		if _, err := fmt.Fprintf(w, "== stage %d: %d requests ==\n", i+1, r.Info.Requests); err != nil {
			return fmt.Errorf("bench: writing table: %w", err)
		}
		if err := r.WriteTable(w); err != nil {
			return err
		}
		if i < len(stages)-1 {
			if _, err := io.WriteString(w, "\n"); err != nil {
				return fmt.Errorf("bench: writing table: %w", err)
			}
		}
	}
	if gw != nil {
		var b strings.Builder
		if err := gw.writeTable(&b); err != nil {
			return fmt.Errorf("bench: writing table: %w", err)
		}
		if _, err := io.WriteString(w, b.String()); err != nil {
			return fmt.Errorf("bench: writing table: %w", err)
		}
	}
	return nil
}

// WriteStagesJSON writes the stages as {"stages": [...]}, each element the
// object Result.WriteJSON writes, with "gateway" (for all the stages) when gw
// is not nil.
func WriteStagesJSON(w io.Writer, stages []*Result, gw *GatewayStats) error {
	raw := make([]json.RawMessage, len(stages))
	for i, r := range stages {
		var b strings.Builder
		if err := r.WriteJSON(&b); err != nil {
			return err
		}
		raw[i] = json.RawMessage(b.String())
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(struct {
		Stages  []json.RawMessage `json:"stages"`
		Gateway *GatewayStats     `json:"gateway,omitempty"`
	}{raw, gw}); err != nil {
		return fmt.Errorf("bench: writing JSON: %w", err)
	}
	return nil
}
