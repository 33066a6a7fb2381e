package bench

import (
	"fmt"
	"slices"
	"strings"
	"text/tabwriter"

	gwstats "github.com/tollgate-llm/tollgate/stats"
)

// writeTable writes the side-by-side section of the table report.
func (gs *GatewayStats) writeTable(b *strings.Builder) error {
	all := ""
	if gs.Runs > 1 {
		all = fmt.Sprintf(", all %d runs together", gs.Runs)
	}
	fmt.Fprintf(b, "\nclient vs gateway%s (/stats window %s, route %s, model %s)\n", all, orDash(gs.Window), gs.Route, gs.Model)
	if gs.Group == nil {
		fmt.Fprintf(b, "no gateway figures: %s\n", gs.Note)
		return nil
	}
	g := &gs.Group.Figures
	c := &gs.Client
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tclient\t\t\t\tgateway\t\t\t\t")
	fmt.Fprintln(tw, "ms\tP50\tP95\tP99\tmean\tP50\tP95\tP99\tmean\t")
	for _, f := range []struct {
		name string
		c    *Stats
		g    *gwstats.Quantiles
	}{
		{"TTFT", &c.TTFT, &g.TTFT}, {"TPOT", &c.TPOT, &g.TPOT}, {"ITL", &c.ITL, &g.ITL},
		{"E2E", &c.E2E, &g.E2E}, {"overhead", nil, &g.Overhead},
	} {
		fmt.Fprint(tw, f.name)
		if f.c == nil {
			fmt.Fprint(tw, "\t-\t-\t-\t-")
		} else {
			for _, v := range []float64{f.c.Median, f.c.P95, f.c.P99, f.c.Mean} {
				fmt.Fprint(tw, "\t", msCell(f.c, v))
			}
		}
		for _, v := range []float64{f.g.P50, f.g.P95, f.g.P99, f.g.Mean} {
			cell := "-"
			if f.g.Count > 0 {
				cell = fmt.Sprintf("%.2f", v)
			}
			fmt.Fprint(tw, "\t", cell)
		}
		fmt.Fprintln(tw, "\t")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.WriteByte('\n')

	tw = tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "\tclient\tgateway\t")
	sent := fmt.Sprintf("%d sent", gs.ClientAttempts)
	if gs.ClientAttempts != c.Requests {
		sent = fmt.Sprintf("%d sent (%d requests + %d retries)", gs.ClientAttempts, c.Requests, gs.ClientAttempts-c.Requests)
	}
	fmt.Fprintf(tw, "requests\t%s\t%d counted\t\n", sent, gs.Run.Requests)
	fmt.Fprintf(tw, "goodput\t%d/%d (%.1f%%)\t%d/%d (%.1f%%)\t\n",
		c.Goodput.Good, c.Requests, 100*c.Goodput.Ratio, gs.Run.Good, gs.Run.Total, 100*gs.Run.Ratio)
	fmt.Fprintf(tw, "output tokens\t%d\t%d\t\n", c.OutputTokens, gs.Run.OutputTokens)
	fmt.Fprintf(tw, "cost USD\t-\t%.6f\t\n", gs.Run.CostUSD)
	if len(gs.Run.Rejections) > 0 {
		fmt.Fprintf(tw, "rejected\t-\t%s\t\n", countsText(gs.Run.Rejections))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	if gs.Counts == "series" {
		fmt.Fprintf(b, "gateway counts: /stats/series (1 min slices) from the minute the run began, less that minute's before the run (%d − %d); "+
			"its quantiles: the whole window's (%.0f s, %d requests), ±%g%% (sketch).\n",
			gs.RequestsAfter, gs.RequestsBefore, gs.WindowSeconds, gs.WindowRequests, 100*gs.RelativeError)
	} else {
		fmt.Fprintf(b, "gateway counts: the window's after the run less before it (%d − %d); its quantiles: the whole window's (%.0f s), ±%g%% (sketch).\n",
			gs.RequestsAfter, gs.RequestsBefore, gs.WindowSeconds, 100*gs.RelativeError)
	}
	if gs.CountsUnreliable {
		fmt.Fprintf(b, "WARNING: the gateway's counts for the run are unreliable: %s.\n", gs.CountsNote)
	}
	switch {
	case gs.WindowSeconds+1 < gs.RunSeconds:
		fmt.Fprintf(b, "WARNING: the window reaches back %.0f s but the run began %.0f s before the fetch (the gateway restarted?): its quantiles miss part of the run.\n",
			gs.WindowSeconds, gs.RunSeconds)
	case gs.WindowRequests < gs.Run.Requests:
		fmt.Fprintf(b, "WARNING: the %s window holds %d of the run's %d requests: its quantiles miss the others.\n",
			gs.Window, gs.WindowRequests, gs.Run.Requests)
	case gs.WindowRequests > gs.Run.Requests:
		fmt.Fprintf(b, "WARNING: other traffic: the %s window holds %d requests, %d of them from the run; the gateway's quantiles include the others.\n",
			gs.Window, gs.WindowRequests, gs.Run.Requests)
	}
	switch {
	case gs.Run.Requests > int64(gs.ClientAttempts):
		fmt.Fprintf(b, "WARNING: other traffic: the gateway counted %d requests during the run, the client sent %d; its counts and quantiles include requests not from this run.\n",
			gs.Run.Requests, gs.ClientAttempts)
	case gs.Run.Requests < int64(gs.ClientAttempts):
		fmt.Fprintf(b, "WARNING: the gateway counted %d of the %d requests sent (connection failures, or replicas that each report their own).\n",
			gs.Run.Requests, gs.ClientAttempts)
	}
	b.WriteString("Why they differ: the client's times include the network and its own reading of the stream; the gateway's\n" +
		"run from the request's arrival to the first (TTFT) or last (E2E) byte written to the client, and its TPOT and\n" +
		"ITL from tokens as read from the upstream. Goodput: the client's against -slo-*, the gateway's against its [slo].\n")
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// countsText lists counts by name in name order, e.g. "rpm:2 tpm:1".
func countsText(m map[string]int64) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
