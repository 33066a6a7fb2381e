package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tollgate-llm/tollgate/internal/retryhint"
	"github.com/tollgate-llm/tollgate/llm"
	gwstats "github.com/tollgate-llm/tollgate/stats"
)

// StatsURL returns the /stats URL of a tollgate: base read as
// Config.BaseURL (a trailing /v1 is dropped) with /stats appended, or base
// as it is when its path already ends in /stats. Its query is dropped
// (WatchGateway sets it), and so are credentials (user:password@): /stats
// is public, and bench sends it no secret.
func StatsURL(base string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("bench: stats URL is not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("bench: stats URL %q: want http:// or https:// and a host", u.Redacted())
	}
	path := strings.TrimSuffix(u.Path, "/")
	if !strings.HasSuffix(path, "/stats") {
		path = strings.TrimSuffix(path, "/v1") + "/stats"
	}
	u.User, u.Path, u.RawPath, u.RawQuery, u.Fragment = nil, path, "", "", ""
	return u.String(), nil
}

// Bounds of each /stats fetch.
const (
	statsTimeout  = 5 * time.Second
	statsBodyCap  = 4 << 20
	statsTries    = 3 // /stats answers 503 while too many are served at once
	statsMaxWait  = 2 * time.Second
	retryAfterDef = time.Second
)

// GatewayWatch reads a tollgate's /stats around a run, to put the gateway's
// own figures for the run beside the client's. It never sends the API key,
// nor any credentials: /stats is public on the serving port.
type GatewayWatch struct {
	url          string // /stats, without a query or credentials
	route, model string
	client       *http.Client
	before       *gwstats.Report
	// series is false when the gateway has no /stats/series (one from
	// before it): the run's counts are then the window's after the run
	// less before it.
	series bool
	// from is the start of the series' slice current at the first read,
	// and first that slice's counts then; from is zero when the group
	// had nothing in the last hour, so that every slice counts.
	from  time.Time
	first counts
}

// seriesWindow is the /stats/series window the run's counts are read from:
// one-minute slices over the last hour, which hold the slice current at
// the first read for runs up to 59 minutes, longer than any run pickWindow
// takes.
const seriesWindow = "1h"

// WatchGateway fetches statsURL (see StatsURL) once before a run of cfg, and
// its /stats/series: it asks for cfg's route (chat_completions, messages or
// responses)
// and model, teams merged, in every window, since the window is chosen from
// the run's duration once it is known. It fails when the answer is not a
// tollgate's /stats report. A gateway without /stats/series (404) is read
// the older way (see GatewayStats.Counts). client nil means a client of its
// own.
func WatchGateway(ctx context.Context, statsURL string, cfg Config, client *http.Client) (*GatewayWatch, error) {
	route := llm.RouteChatCompletions
	switch cfg.Dialect {
	case llm.DialectAnthropic:
		route = llm.RouteMessages
	case llm.DialectResponses:
		route = llm.RouteResponses
	}
	if client == nil {
		// A few fetches, one at a time, minutes apart: a connection kept
		// between them would only outlive the command.
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.DisableKeepAlives = true
		client = &http.Client{Transport: tr}
	}
	if u, err := url.Parse(statsURL); err == nil && u.User != nil {
		u.User = nil // whoever built the URL, /stats gets no credentials
		statsURL = u.String()
	}
	w := &GatewayWatch{url: statsURL, route: route.String(), model: cfg.Model, client: client}
	rep, err := w.fetchReport(ctx, "")
	if err != nil {
		return nil, err
	}
	w.before = rep
	sr, err := w.fetchSeries(ctx)
	switch {
	case errors.Is(err, errNoSeries):
	case err != nil:
		return nil, err
	default:
		w.series = true
		// The group's last point is the slice current at the read; with
		// no group the gateway counted nothing for it in the last hour.
		if s := w.findSeries(sr); s != nil && len(s.Points) > 0 {
			p := &s.Points[len(s.Points)-1]
			w.from, w.first = p.Start, countsOf(&p.Figures)
		}
	}
	return w, nil
}

var (
	// errNoSeries is a gateway that does not serve /stats/series.
	errNoSeries = errors.New("no /stats/series")
	// errNotStats is an answer that is not what a tollgate serves there.
	errNotStats = errors.New("not a tollgate /stats report")
)

// query returns the URL of path (/stats or /stats/series) for window (""
// for all).
func (w *GatewayWatch) query(path, window string) string {
	q := url.Values{}
	q.Set("route", w.route)
	q.Set("model", w.model)
	q.Set("merge", "team")
	if window != "" {
		q.Set("window", window)
	}
	return path + "?" + q.Encode()
}

// fetchReport GETs /stats for window.
func (w *GatewayWatch) fetchReport(ctx context.Context, window string) (*gwstats.Report, error) {
	rep := new(gwstats.Report)
	if err := w.fetch(ctx, w.url, w.query(w.url, window), rep); err != nil {
		return nil, err
	}
	if rep.Sketch.Kind == "" {
		return nil, fmt.Errorf("bench: %s: %w", redact(w.url), errNotStats)
	}
	return rep, nil
}

// fetchSeries GETs /stats/series for seriesWindow. It returns errNoSeries
// when the gateway has none: a 404, or an answer that is not a series.
func (w *GatewayWatch) fetchSeries(ctx context.Context) (*gwstats.SeriesReport, error) {
	where := w.url + "/series"
	sr := new(gwstats.SeriesReport)
	err := w.fetch(ctx, where, w.query(where, seriesWindow), sr)
	var se *statusError
	if errors.As(err, &se) && se.code == http.StatusNotFound || errors.Is(err, errNotStats) ||
		err == nil && (sr.Sketch.Kind == "" || sr.Window != seriesWindow) {
		return nil, errNoSeries
	}
	if err != nil {
		return nil, err
	}
	return sr, nil
}

// findSeries returns sr's series for the watched route and model with
// teams merged, or nil.
func (w *GatewayWatch) findSeries(sr *gwstats.SeriesReport) *gwstats.Series {
	for i := range sr.Series {
		if s := &sr.Series[i]; s.Route == w.route && s.Model == w.model && s.Team == "*" {
			return s
		}
	}
	return nil
}

// statusError is an answer other than 200.
type statusError struct {
	where string
	code  int
}

func (e *statusError) Error() string { return fmt.Sprintf("bench: %s: status %d", e.where, e.code) }

// fetch GETs u (a query of where) into the JSON document dst, trying again
// after a 503.
func (w *GatewayWatch) fetch(ctx context.Context, where, u string, dst any) error {
	for try := 1; ; try++ {
		wait, err := w.get(ctx, where, u, dst)
		if wait == 0 || try == statsTries {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("bench: %s: %w", redact(where), ctx.Err())
		}
	}
}

// get GETs u once. A 503 comes with how long to wait before the next try.
func (w *GatewayWatch) get(ctx context.Context, where, u string, dst any) (wait time.Duration, err error) {
	ctx, cancel := context.WithTimeout(ctx, statsTimeout)
	defer cancel()
	where = redact(where)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("bench: %s: %w", where, err)
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tollgate-bench")
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // it quotes the URL
		}
		return 0, fmt.Errorf("bench: %s: %w", where, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, statsBodyCap))
	if err != nil {
		return 0, fmt.Errorf("bench: %s: reading the answer: %w", where, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := &statusError{where: where, code: resp.StatusCode}
		if resp.StatusCode == http.StatusServiceUnavailable {
			wait, ok := retryhint.Parse(resp.Header, time.Now())
			if !ok {
				wait = retryAfterDef
			}
			return min(max(wait, statsPoll), statsMaxWait), err
		}
		return 0, err
	}
	if err := json.Unmarshal(body, dst); err != nil {
		return 0, fmt.Errorf("bench: %s: %w", where, errNotStats)
	}
	return 0, nil
}

// redact returns raw without its credentials.
func redact(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return u.Redacted()
	}
	return "the stats URL"
}
