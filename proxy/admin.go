package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/tollgate-llm/tollgate/ratelimit"
	"github.com/tollgate-llm/tollgate/spend"
)

// adminTimeout bounds an admin query against the limiter or the ledger.
const adminTimeout = 5 * time.Second

// adminRoutes mounts GET /admin/spend and GET /admin/limits behind the admin
// token. Without a token configured they are not mounted (404).
func (g *Gateway) adminRoutes(r chi.Router) {
	if !g.hasAdmin {
		return
	}
	r.Route("/admin", func(r chi.Router) {
		r.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if !g.isAdmin(r) {
					w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate admin"`)
					adminError(w, http.StatusUnauthorized, "missing or wrong admin token: send \"Authorization: Bearer <token>\"")
					return
				}
				next.ServeHTTP(w, r)
			})
		})
		r.Get("/spend", g.adminSpend)
		r.Get("/limits", g.adminLimits)
		r.Post("/reload", g.adminReload)
		r.Get("/conversations/{id}", g.adminConversation)
		r.Get("/debug/pprof/{name}", adminProfile)
		g.keysRoutes(r)
	})
}

// adminProfile serves the Go runtime's profiles (net/http/pprof) to the
// admin: a CPU profile (profile?seconds=N), an execution trace
// (trace?seconds=N), and heap, allocs, goroutine, block, mutex and
// threadcreate (?debug=1 for text). They show where a running gateway
// spends its time and memory without a rebuild. They hold stacks and
// sizes, never a request's bytes; the command line is not served (the
// package also registers its handlers on http.DefaultServeMux, which the
// gateway never serves).
func adminProfile(w http.ResponseWriter, r *http.Request) {
	switch name := chi.URLParam(r, "name"); name {
	case "profile":
		pprof.Profile(w, r)
	case "trace":
		pprof.Trace(w, r)
	case "heap", "allocs", "goroutine", "block", "mutex", "threadcreate":
		pprof.Handler(name).ServeHTTP(w, r)
	default:
		adminError(w, http.StatusNotFound, "no such profile: use profile, trace, heap, allocs, goroutine, block, mutex or threadcreate")
	}
}

// isAdmin reports whether r presents the admin token as its bearer token.
func (g *Gateway) isAdmin(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
	return ok && g.hasAdmin && subtle.ConstantTimeCompare(sum[:], g.adminToken[:]) == 1
}

// maxReloadBody caps the config document POST /admin/reload?check=true
// takes.
const maxReloadBody = 4 << 20

// ErrNothingToReload is Options.Reload's error when the gateway was not
// started from a config file (the demo, tests).
var ErrNothingToReload = errors.New("this gateway was not started from a config file: there is nothing to reload")

// ReloadReport is the body of a POST /admin/reload that succeeded.
type ReloadReport struct {
	// Result is "reloaded" (the file was swapped in), "unchanged" (it
	// equals the running configuration) or "valid" (a check: it would
	// reload cleanly, and nothing changed).
	Result string `json:"result"`
	// Changed lists the tables and keys that differ from the running
	// configuration ("keys", "upstreams", "log.level", ...).
	Changed []string `json:"changed"`
}

// adminReload serves POST /admin/reload: the gateway reads its config file
// again and swaps it in (Options.Reload). With ?check=true the body is a
// config document checked against the running configuration (?name= names
// it in the errors), and nothing changes. A file that does not load, or changes a key that needs a
// restart, gets 422 with every problem (file:line: key: problem).
func (g *Gateway) adminReload(w http.ResponseWriter, r *http.Request) {
	if g.reload == nil {
		adminError(w, http.StatusNotFound, ErrNothingToReload.Error())
		return
	}
	check := false
	if v := r.URL.Query().Get("check"); v != "" {
		var err error
		if check, err = strconv.ParseBool(v); err != nil {
			adminError(w, http.StatusBadRequest, "check must be true or false, not "+strconv.Quote(v))
			return
		}
	}
	doc, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxReloadBody))
	switch {
	case err != nil:
		adminError(w, http.StatusRequestEntityTooLarge, "the config document is over 4 MiB or could not be read: "+err.Error())
		return
	case check && len(doc) == 0:
		adminError(w, http.StatusBadRequest, "check=true needs the config document to check as the request body")
		return
	case !check && len(doc) > 0:
		// A document sent without check=true would otherwise be ignored
		// while the file on disk is swapped in.
		adminError(w, http.StatusBadRequest, "a reload reads the gateway's own config file and takes no body; send check=true to check a document")
		return
	case !check:
		doc = nil
	}
	name := r.URL.Query().Get("name")
	if check && name == "" {
		name = "posted config"
	}
	changed, err := g.reload(doc, name)
	if errors.Is(err, ErrNothingToReload) {
		adminError(w, http.StatusNotFound, err.Error())
		return
	}
	if err != nil {
		adminError(w, http.StatusUnprocessableEntity, err.Error())
		return
	}
	rep := ReloadReport{Result: "reloaded", Changed: changed}
	switch {
	case check:
		rep.Result = "valid"
	case len(changed) == 0:
		rep.Result = "unchanged"
	}
	if rep.Changed == nil {
		rep.Changed = []string{}
	}
	writeJSON(w, http.StatusOK, rep)
}

func adminError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"message": msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// SpendRow is one row of GET /admin/spend.
type SpendRow struct {
	Day              string  `json:"day"`
	KeyID            string  `json:"key_id"`
	Team             string  `json:"team"`
	Model            string  `json:"model"`
	Requests         int64   `json:"requests"`
	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`
	CacheReadTokens  int64   `json:"cache_read_tokens"`
	CacheWriteTokens int64   `json:"cache_write_tokens"`
	ReasoningTokens  int64   `json:"reasoning_tokens"`
	CostMicros       int64   `json:"cost_micros"`
	CostUSD          float64 `json:"cost_usd"`
}

// SpendReport is the body of GET /admin/spend: the matching rows and their
// sum.
type SpendReport struct {
	Filter spend.Filter `json:"filter"`
	Rows   []SpendRow   `json:"rows"`
	Total  SpendRow     `json:"total"`
	// Partial says that the rows miss spend: the shared ledger could not be
	// read and they are only what this replica billed itself, or Redis lost
	// its data and the replicas have not all sent theirs back yet. Note
	// says which.
	Partial bool   `json:"partial,omitempty"`
	Note    string `json:"note,omitempty"`
}

func spendRow(k spend.Key, t spend.Totals) SpendRow {
	return SpendRow{Day: k.Day, KeyID: k.KeyID, Team: k.Team, Model: k.Model,
		Requests: t.Requests, InputTokens: t.Input, OutputTokens: t.Output, CacheReadTokens: t.CacheRead,
		CacheWriteTokens: t.CacheWrite, ReasoningTokens: t.Reasoning, CostMicros: t.CostMicros,
		CostUSD: float64(t.CostMicros) / 1e6}
}

// adminSpend serves GET /admin/spend?team=&key=&model=&from=&to= (days as
// YYYY-MM-DD, inclusive, UTC).
func (g *Gateway) adminSpend(w http.ResponseWriter, r *http.Request) {
	if g.ledger == nil {
		adminError(w, http.StatusNotFound, "no spend ledger is configured")
		return
	}
	q := r.URL.Query()
	f := spend.Filter{Team: q.Get("team"), KeyID: q.Get("key"), Model: q.Get("model"), From: q.Get("from"), To: q.Get("to")}
	for _, d := range []struct{ name, v string }{{"from", f.From}, {"to", f.To}} {
		if d.v == "" {
			continue
		}
		if _, err := time.Parse(time.DateOnly, d.v); err != nil {
			adminError(w, http.StatusBadRequest, d.name+" must be a day as YYYY-MM-DD")
			return
		}
	}
	if f.From != "" && f.To != "" && f.From > f.To {
		adminError(w, http.StatusBadRequest, "from is after to")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	rep := SpendReport{Filter: f}
	rows, err := g.ledger.Query(ctx, f)
	if own, ok := g.ledger.(spend.OwnQuerier); ok && err != nil && ctx.Err() == nil {
		g.log.Warn("admin: the shared spend ledger cannot be read; answering with this replica's own spend", "err", err)
		rep.Partial = true
		rep.Note = "the shared ledger cannot be read (" + err.Error() + "): these rows are only what this replica billed; the other replicas' spend is missing"
		rows, err = own.QueryOwn(ctx, f)
	}
	if ic, ok := g.ledger.(spend.Incompleter); ok && err == nil && !rep.Partial && ic.Incomplete(ctx) {
		rep.Partial = true
		rep.Note = "Redis lost its data and the replicas are still sending their spend back: these totals miss some of it"
	}
	if err != nil {
		g.log.Warn("admin: spend query failed", "err", err)
		adminError(w, http.StatusServiceUnavailable, "the spend ledger cannot be read right now: "+err.Error())
		return
	}
	rep.Rows = make([]SpendRow, 0, len(rows))
	var total spend.Totals
	for _, row := range rows {
		rep.Rows = append(rep.Rows, spendRow(row.Key, row.Totals))
		total.Add(row.Totals)
	}
	rep.Total = spendRow(spend.Key{}, total)
	writeJSON(w, http.StatusOK, rep)
}

// LimitState is one limit of one key or team in GET /admin/limits.
type LimitState struct {
	Limit string `json:"limit"`
	Max   int64  `json:"max"`
	// Used is a budget's settled usage, the open requests (concurrency) or
	// a rate's consumed share.
	Used int64 `json:"used"`
	// Reserved is what requests in flight hold of a budget beyond Used (0
	// for other limits); Remaining is the limit less both.
	Reserved  int64 `json:"reserved"`
	Remaining int64 `json:"remaining"`
	// ResetSeconds is the time until a rate is full again or a budget's
	// window ends (0 for concurrency).
	ResetSeconds float64 `json:"reset_seconds"`
	ResetAt      string  `json:"reset_at,omitempty"`
}

// SubjectLimits are the limits of one key or team.
type SubjectLimits struct {
	Scope  string       `json:"scope"`
	ID     string       `json:"id"`
	Team   string       `json:"team,omitempty"`
	Limits []LimitState `json:"limits"`
}

// LimitsReport is the body of GET /admin/limits.
type LimitsReport struct {
	Subjects []SubjectLimits `json:"subjects"`
}

// adminLimits serves GET /admin/limits: every key and team with a limit,
// with what is used and left now.
func (g *Gateway) adminLimits(w http.ResponseWriter, r *http.Request) {
	gv := g.gen.Load().gov
	var subjects []ratelimit.Subject
	teamOf := map[string]string{}
	keys := slices.Collect(maps.Values(gv.keys))
	if idx := gv.runtime.Load(); idx != nil {
		keys = slices.AppendSeq(keys, maps.Values(idx.keys))
	}
	for _, k := range keys {
		if k.limited {
			subjects = append(subjects, k.subject)
			if k.team != nil {
				teamOf[k.name] = k.team.name
			}
		}
	}
	for _, t := range gv.teams {
		if t.limited {
			subjects = append(subjects, t.subject)
		}
	}
	sort.Slice(subjects, func(i, j int) bool {
		if subjects[i].Scope != subjects[j].Scope {
			return subjects[i].Scope > subjects[j].Scope // teams first
		}
		return subjects[i].ID < subjects[j].ID
	})
	rep := LimitsReport{Subjects: []SubjectLimits{}}
	if len(subjects) == 0 || gv.limiter == nil {
		writeJSON(w, http.StatusOK, rep)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	states, err := gv.limiter.Peek(ctx, subjects)
	if err != nil {
		g.log.Warn("admin: limits query failed", "err", err)
		adminError(w, http.StatusServiceUnavailable, "the limiter cannot be read right now: "+err.Error())
		return
	}
	now := g.now()
	idx := map[[2]string]int{}
	for _, s := range subjects {
		sl := SubjectLimits{Scope: s.Scope.String(), ID: s.ID, Limits: []LimitState{}}
		if s.Scope == ratelimit.ScopeKey {
			sl.Team = teamOf[s.ID]
		}
		idx[[2]string{sl.Scope, sl.ID}] = len(rep.Subjects)
		rep.Subjects = append(rep.Subjects, sl)
	}
	for _, st := range states {
		i, ok := idx[[2]string{st.Scope.String(), st.ID}]
		if !ok {
			continue
		}
		ls := LimitState{Limit: st.Kind.String(), Max: st.Limit, Used: st.Used, Reserved: st.Reserved,
			Remaining: st.Remaining, ResetSeconds: st.Reset.Seconds()}
		if st.Reset > 0 {
			ls.ResetAt = now.Add(st.Reset).UTC().Format(time.RFC3339)
		}
		rep.Subjects[i].Limits = append(rep.Subjects[i].Limits, ls)
	}
	writeJSON(w, http.StatusOK, rep)
}
