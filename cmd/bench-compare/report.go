package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// median of xs (0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// row is one figure for every target; ratio says how tollgate's is put
// against nginx's in the last column: "x" (a ratio), "-" (a difference),
// "" (none).
type row struct {
	name  string
	ratio string
	value func(name string, round int) (float64, bool)
	unit  string
}

// writeTable prints s's figures: one column per target, medians over the
// rounds, and tollgate against nginx.
func writeTable(w io.Writer, s shape, targets []*target, res map[string][]run) {
	rounds := 0
	for _, rs := range res {
		rounds = max(rounds, len(rs))
	}
	get := func(name string, i int) (*run, bool) {
		rs := res[name]
		if i >= len(rs) {
			return nil, false
		}
		return &rs[i], true
	}
	// per-round figure of a target, and the same less direct's in that round.
	fig := func(f func(*run) float64) func(string, int) (float64, bool) {
		return func(name string, i int) (float64, bool) {
			r, ok := get(name, i)
			if !ok || r.requests == r.errors {
				return 0, false
			}
			return f(r), true
		}
	}
	added := func(f func(*run) float64) func(string, int) (float64, bool) {
		return func(name string, i int) (float64, bool) {
			r, ok := get(name, i)
			d, dok := get("direct", i)
			if !ok || !dok || name == "direct" || r.requests == r.errors {
				return 0, false
			}
			return f(r) - f(d), true
		}
	}
	q := func(pick func(*run) []time.Duration, p float64) func(*run) float64 {
		return func(r *run) float64 { return ms(quantile(pick(r), p)) }
	}
	ttft := func(r *run) []time.Duration { return r.ttft }
	itl := func(r *run) []time.Duration { return r.itl }
	var rows []row
	if s.held {
		rows = []row{
			{"streams held at once", "", fig(func(r *run) float64 { return float64(r.requests) }), ""},
			{"RSS with all open", "x", fig(func(r *run) float64 { return float64(r.peakKiB) / 1024 }), "MiB"},
			{"memory per stream", "x", fig(func(r *run) float64 { return r.perStreamKiB }), "KiB"},
		}
	} else {
		if s.stream {
			rows = append(rows,
				row{"TTFT p50", "", fig(q(ttft, 0.5)), "ms"},
				row{"TTFT p99", "", fig(q(ttft, 0.99)), "ms"},
				row{"added TTFT p50", "-", added(q(ttft, 0.5)), "ms"},
				row{"added TTFT p99", "-", added(q(ttft, 0.99)), "ms"},
				row{"ITL p99", "", fig(q(itl, 0.99)), "ms"},
				row{"added ITL p50", "-", added(q(itl, 0.5)), "ms"},
				row{"added ITL p99", "-", added(q(itl, 0.99)), "ms"},
			)
		} else {
			rows = append(rows,
				row{"latency p50", "", fig(q(ttft, 0.5)), "ms"},
				row{"latency p99", "", fig(q(ttft, 0.99)), "ms"})
		}
		rows = append(rows,
			row{"requests/s", "x", fig(func(r *run) float64 { return r.rps() }), ""},
			row{"requests/s vs direct", "x", func(name string, i int) (float64, bool) {
				r, ok := get(name, i)
				d, dok := get("direct", i)
				if !ok || !dok || r.requests == r.errors {
					return 0, false
				}
				return r.rps() / d.rps(), true
			}, "×"},
			row{"CPU per 1,000 requests", "x", fig(func(r *run) float64 { return r.cpuPer1000() }), "s"},
			row{"peak RSS", "x", fig(func(r *run) float64 { return float64(r.peakKiB) / 1024 }), "MiB"},
		)
	}
	fmt.Fprintf(w, "## %s: %s\n\n", s.name, describe(s))
	head := []string{"figure"}
	for _, t := range targets {
		if s.held && t.name == "direct" {
			continue
		}
		head = append(head, t.name)
	}
	_, hasNginx := res["nginx"]
	if hasNginx {
		head = append(head, "tollgate vs nginx")
	}
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat(" --- |", len(head)))
	for _, r := range rows {
		cells := []string{r.name}
		meds := map[string]float64{}
		for _, t := range targets {
			if s.held && t.name == "direct" {
				continue
			}
			var xs []float64
			for i := range rounds {
				if v, ok := r.value(t.name, i); ok {
					xs = append(xs, v)
				}
			}
			if len(xs) == 0 {
				cells = append(cells, "–")
				continue
			}
			meds[t.name] = median(xs)
			cells = append(cells, format(meds[t.name], r.unit))
		}
		if hasNginx {
			tv, tok := meds["tollgate"]
			nv, nok := meds["nginx"]
			switch {
			case !tok || !nok || r.ratio == "":
				cells = append(cells, "")
			case r.ratio == "x" && nv != 0:
				cells = append(cells, fmt.Sprintf("×%.2f", tv/nv))
			case r.ratio == "-":
				cells = append(cells, fmt.Sprintf("%+.2f ms", tv-nv))
			default:
				cells = append(cells, "")
			}
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	}
	// Errors, all rounds together, and the first one seen.
	cells := []string{"requests / errors (all rounds)"}
	var notes []string
	for _, t := range targets {
		if s.held && t.name == "direct" {
			continue
		}
		n, e := 0, 0
		for _, r := range res[t.name] {
			n, e = n+r.requests, e+r.errors
			if r.firstErr != "" && len(notes) < 4 {
				notes = append(notes, fmt.Sprintf("%s: %s", t.name, r.firstErr))
			}
		}
		cells = append(cells, fmt.Sprintf("%d / %d", n, e))
	}
	if hasNginx {
		cells = append(cells, "")
	}
	fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
	for _, n := range notes {
		fmt.Fprintf(w, "\nfirst error, %s\n", n)
	}
	if s.held {
		fmt.Fprintln(w, "\nnginx's figures are the sum over its master and workers.")
	} else {
		fmt.Fprintln(w, "\nCPU and RSS are each process's own: direct's are the fake upstream's, nginx's the sum over its master and workers.")
	}
}

func format(v float64, unit string) string {
	switch unit {
	case "ms":
		return fmt.Sprintf("%.2f ms", v)
	case "×":
		return fmt.Sprintf("×%.2f", v)
	case "":
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

func describe(s shape) string {
	if s.held {
		return fmt.Sprintf("%d streams held open at once (each paused after its first token)", s.requests)
	}
	kind := "non-streamed"
	if s.stream {
		kind = "streamed"
	}
	return fmt.Sprintf("%d %s requests, %d at a time, %d tokens, TTFT %s, %s per token", s.requests, kind, s.concurrency, s.tokens, s.ttft, s.itl)
}
