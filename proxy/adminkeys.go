package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/keystore"
)

// The runtime keys' admin API: issue, list, show, revoke and rotate keys,
// and read the audit log. A key's secret is in the answer that issues it
// and nowhere else; the store, the logs and every other answer hold its
// SHA-256 at most.

// KeyRequest is the body of POST /admin/keys (and, for its expiry only,
// of POST /admin/keys/{name}/rotate).
type KeyRequest struct {
	Name string `json:"name"`
	Team string `json:"team,omitempty"`
	config.Limits
	// ExpiresAt (RFC 3339) or ExpiresIn (a Go duration, "720h") is when
	// the key stops working; neither: never.
	ExpiresAt string            `json:"expires_at,omitempty"`
	ExpiresIn string            `json:"expires_in,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
}

// KeyView is one key in the admin API's answers: a runtime key, or a
// [[keys]] table (Source "config", with only its name, id, team and
// limits).
type KeyView struct {
	Name string `json:"name"`
	// ID is the hash prefix the access log and refusals name the key by.
	ID     string `json:"id"`
	SHA256 string `json:"sha256"`
	Source string `json:"source"` // "runtime" or "config"
	// Status is "active", "expired" or "revoked"; "shadowed" for a
	// runtime key a [[keys]] table of its name hides, "orphaned" for one
	// whose team is not configured.
	Status string `json:"status"`
	Team   string `json:"team,omitempty"`
	config.Limits
	Labels    map[string]string `json:"labels,omitempty"`
	Created   time.Time         `json:"created,omitzero"`
	CreatedBy string            `json:"created_by,omitempty"`
	Expires   time.Time         `json:"expires,omitzero"`
	Revoked   time.Time         `json:"revoked,omitzero"`
	RevokedBy string            `json:"revoked_by,omitempty"`
	Rotated   time.Time         `json:"rotated,omitzero"`
}

// IssuedKey is the answer to a create or a rotate: the key's secret, shown
// this once, and the key.
type IssuedKey struct {
	Key    string  `json:"key"`
	Note   string  `json:"note"`
	Record KeyView `json:"record"`
}

// KeysReport is the body of GET /admin/keys.
type KeysReport struct {
	Keys []KeyView `json:"keys"`
}

// AuditReport is the body of GET /admin/keys/audit.
type AuditReport struct {
	Events []keystore.Event `json:"events"`
}

const (
	// maxKeyRequest caps a key request's body.
	maxKeyRequest = 64 << 10
	// maxLabels, maxLabelValue: labels are notes, not a database.
	maxLabels     = 32
	maxLabelValue = 256
	// maxActor caps X-Tollgate-Actor.
	maxActor = 128
	// defaultAudit, maxAudit bound GET /admin/keys/audit's limit.
	defaultAudit = 100
)

// labelNameRE is what a label's name may hold.
var labelNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// keysRoutes mounts the runtime keys' admin API under /admin/keys. Without
// runtime keys each answers 404 saying how to turn them on.
func (g *Gateway) keysRoutes(r chi.Router) {
	r.Route("/keys", func(r chi.Router) {
		r.Use(func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if g.keys == nil {
					adminError(w, http.StatusNotFound, "runtime keys are off: set [runtime_keys] enabled = true (mode \"keys\")")
					return
				}
				next.ServeHTTP(w, r)
			})
		})
		r.Post("/", g.createKey)
		r.Get("/", g.listKeys)
		// "audit" is a path of its own, so no key may be named so.
		r.Get("/audit", g.keysAudit)
		r.Get("/{name}", g.showKey)
		r.Post("/{name}/revoke", g.revokeKey)
		r.Post("/{name}/rotate", g.rotateKey)
	})
}

// actor is who the admin request says it comes from (X-Tollgate-Actor; the
// CLI sends the user's name), "admin" when it does not say: every operator
// shares the admin token, so the audit log can keep only what they claim,
// and the address the request came from.
func actor(r *http.Request) (string, error) {
	a := strings.TrimSpace(r.Header.Get("X-Tollgate-Actor"))
	switch {
	case a == "":
		return "admin", nil
	case len(a) > maxActor || !printableUTF8(a):
		return "", fmt.Errorf("X-Tollgate-Actor must be at most %d printable characters", maxActor)
	}
	return a, nil
}

// printableUTF8 reports whether s is valid UTF-8 without control
// characters.
func printableUTF8(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// decodeKeyRequest reads a key request strictly: an unknown field (a
// misspelt limit) is an error, never a key issued without the limit.
func decodeKeyRequest(w http.ResponseWriter, r *http.Request, empty bool) (KeyRequest, error) {
	var req KeyRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxKeyRequest))
	if err != nil {
		return req, fmt.Errorf("the body is over %d KiB or could not be read", maxKeyRequest>>10)
	}
	if empty && len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, fmt.Errorf("the body is not a key request: %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return req, errors.New("the body holds more than one JSON document")
	}
	return req, nil
}

// expiry is the expiry a request asks for at now: zero for none.
func (req *KeyRequest) expiry(now time.Time) (time.Time, error) {
	switch {
	case req.ExpiresAt != "" && req.ExpiresIn != "":
		return time.Time{}, errors.New("give expires_at or expires_in, not both")
	case req.ExpiresAt != "":
		t, err := time.Parse(time.RFC3339, req.ExpiresAt)
		if err != nil {
			return time.Time{}, fmt.Errorf("expires_at %q is not an RFC 3339 time (2026-12-31T00:00:00Z)", req.ExpiresAt)
		}
		if !t.After(now) {
			return time.Time{}, fmt.Errorf("expires_at %q is not in the future", req.ExpiresAt)
		}
		return t.UTC(), nil
	case req.ExpiresIn != "":
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			return time.Time{}, fmt.Errorf("expires_in %q is not a positive duration (720h, 90m)", req.ExpiresIn)
		}
		return now.Add(d).UTC().Truncate(time.Second), nil
	}
	return time.Time{}, nil
}

// checkLabels refuses labels that are not short notes.
func checkLabels(labels map[string]string) error {
	if len(labels) > maxLabels {
		return fmt.Errorf("labels: at most %d, not %d", maxLabels, len(labels))
	}
	for _, n := range slices.Sorted(maps.Keys(labels)) {
		switch v := labels[n]; {
		case !labelNameRE.MatchString(n):
			return fmt.Errorf("labels: name %q may hold only A-Z, a-z, 0-9, _, . and -, 1 to 64 of them", n)
		case len(v) > maxLabelValue || !printableUTF8(v):
			return fmt.Errorf("labels: %q's value must be at most %d bytes of printable UTF-8", n, maxLabelValue)
		}
	}
	return nil
}

// createKey serves POST /admin/keys: it issues a key, and answers 201 with
// its secret, the one time the secret is shown.
func (g *Gateway) createKey(w http.ResponseWriter, r *http.Request) {
	who, err := actor(r)
	if err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	req, err := decodeKeyRequest(w, r, false)
	if err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	now := g.now().UTC()
	k := keystore.Key{Key: config.Key{Name: req.Name, Team: req.Team, Limits: req.Limits}, Labels: req.Labels,
		Created: now.Truncate(time.Second), CreatedBy: who}
	cfg := g.Config()
	var problems []error
	if req.Name == "audit" {
		problems = append(problems, errors.New(`name: "audit" is reserved (GET /admin/keys/audit)`))
	}
	if err := cfg.CheckRuntimeKey(&k.Key); err != nil {
		problems = append(problems, err)
	}
	if k.Expires, err = req.expiry(now); err != nil {
		problems = append(problems, err)
	}
	if err := checkLabels(req.Labels); err != nil {
		problems = append(problems, err)
	}
	if len(problems) > 0 {
		adminError(w, http.StatusBadRequest, errors.Join(problems...).Error())
		return
	}
	secret, sum, err := keystore.Secret()
	if err != nil {
		adminError(w, http.StatusInternalServerError, err.Error())
		return
	}
	k.SHA256 = sum
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	ev := keystore.Event{Time: k.Created, Actor: who, Remote: r.RemoteAddr, Action: "create", Name: k.Name, Team: k.Team, SHA256: sum}
	err = g.keys.Store().Create(ctx, k, ev)
	if errors.Is(err, keystore.ErrExists) {
		adminError(w, http.StatusConflict, "a runtime key named "+strconv.Quote(k.Name)+
			" exists and is not revoked: revoke it first, or rotate it for a new secret")
		return
	}
	if err != nil {
		g.log.Warn("admin: runtime key not created", "name", k.Name, "err", err)
		adminError(w, http.StatusServiceUnavailable, "the runtime keys' store cannot be written right now: "+err.Error())
		return
	}
	g.keysChanged(ctx, ev)
	writeJSON(w, http.StatusCreated, IssuedKey{Key: secret, Note: "the key is shown this once; only its SHA-256 is kept",
		Record: g.viewOf(k, now)})
}

// keysChanged logs a change and reads the store at once, so that this
// replica serves the change from its next request (the others within
// their poll interval).
func (g *Gateway) keysChanged(ctx context.Context, ev keystore.Event) {
	g.log.Info("runtime key "+ev.Action, "name", ev.Name, "team", ev.Team, "key_id", ev.SHA256[:12],
		"actor", ev.Actor, "remote", ev.Remote)
	if err := g.keys.Refresh(ctx); err != nil {
		g.log.Warn("runtime keys: changed, but not read back yet; the watcher will", "err", err)
	}
}

// viewOf is k as the admin API shows it at now.
func (g *Gateway) viewOf(k keystore.Key, now time.Time) KeyView {
	v := KeyView{Name: k.Name, ID: k.SHA256[:min(12, len(k.SHA256))], SHA256: k.SHA256, Source: "runtime",
		Status: k.Status(now), Team: k.Team, Limits: k.Limits, Labels: k.Labels, Created: k.Created,
		CreatedBy: k.CreatedBy, Expires: k.Expires, Revoked: k.Revoked, RevokedBy: k.RevokedBy, Rotated: k.Rotated}
	if v.Status == "active" {
		gv := g.gen.Load().gov
		if idx := gv.runtime.Load(); idx != nil {
			if sum, ok := decodeSum(k.SHA256); ok {
				if rf, ok := idx.refused[sum]; ok {
					v.Status = rf.why
				}
			}
		}
	}
	return v
}

// snapshot reads every runtime key from the store (not the replica's
// copy: an operator listing keys sees the store's truth).
func (g *Gateway) snapshot(w http.ResponseWriter, r *http.Request) (keystore.Snapshot, bool) {
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	snap, err := g.keys.Store().Snapshot(ctx)
	if err != nil {
		adminError(w, http.StatusServiceUnavailable, "the runtime keys' store cannot be read right now: "+err.Error())
		return snap, false
	}
	return snap, true
}

// listKeys serves GET /admin/keys: the [[keys]] tables, then the runtime
// keys, each by name.
func (g *Gateway) listKeys(w http.ResponseWriter, r *http.Request) {
	snap, ok := g.snapshot(w, r)
	if !ok {
		return
	}
	now := g.now()
	rep := KeysReport{Keys: []KeyView{}}
	cfg := g.Config()
	for i := range cfg.Keys {
		k := &cfg.Keys[i]
		rep.Keys = append(rep.Keys, KeyView{Name: k.Name, ID: k.SHA256[:12], SHA256: k.SHA256, Source: "config",
			Status: "active", Team: k.Team, Limits: k.Limits})
	}
	slices.SortFunc(rep.Keys, func(a, b KeyView) int { return strings.Compare(a.Name, b.Name) })
	for _, k := range snap.Keys {
		rep.Keys = append(rep.Keys, g.viewOf(k, now))
	}
	writeJSON(w, http.StatusOK, rep)
}

// showKey serves GET /admin/keys/{name}.
func (g *Gateway) showKey(w http.ResponseWriter, r *http.Request) {
	name := chi.URLParam(r, "name")
	snap, ok := g.snapshot(w, r)
	if !ok {
		return
	}
	for _, k := range snap.Keys {
		if k.Name == name {
			writeJSON(w, http.StatusOK, g.viewOf(k, g.now()))
			return
		}
	}
	if ck := g.configKey(name); ck != nil {
		writeJSON(w, http.StatusOK, KeyView{Name: ck.Name, ID: ck.SHA256[:12], SHA256: ck.SHA256, Source: "config",
			Status: "active", Team: ck.Team, Limits: ck.Limits})
		return
	}
	adminError(w, http.StatusNotFound, "no key is named "+strconv.Quote(name))
}

// configKey is the [[keys]] table named name, or nil.
func (g *Gateway) configKey(name string) *config.Key {
	cfg := g.Config()
	for i := range cfg.Keys {
		if cfg.Keys[i].Name == name {
			return &cfg.Keys[i]
		}
	}
	return nil
}

// errKeyState refuses a change the key's state does not allow (409).
type errKeyState string

func (e errKeyState) Error() string { return string(e) }

// changeKey applies change to the runtime key named by the path, as action,
// and answers with what the store holds after it; rotate's answer carries
// the new secret.
func (g *Gateway) changeKey(w http.ResponseWriter, r *http.Request, action string,
	change func(k *keystore.Key, now time.Time) error, secret string) {
	name := chi.URLParam(r, "name")
	who, err := actor(r)
	if err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	if g.configKey(name) != nil {
		adminError(w, http.StatusConflict, strconv.Quote(name)+" is a [[keys]] table in gateway.toml: change it there, and reload")
		return
	}
	now := g.now().UTC()
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	var ev keystore.Event
	k, err := g.keys.Store().Update(ctx, name, func(k *keystore.Key) error { return change(k, now) },
		func(k keystore.Key) keystore.Event {
			ev = keystore.Event{Time: now.Truncate(time.Second), Actor: who, Remote: r.RemoteAddr, Action: action,
				Name: k.Name, Team: k.Team, SHA256: k.SHA256}
			return ev
		})
	var state errKeyState
	switch {
	case errors.Is(err, keystore.ErrNotFound):
		adminError(w, http.StatusNotFound, "no runtime key is named "+strconv.Quote(name))
		return
	case errors.As(err, &state):
		adminError(w, http.StatusConflict, state.Error())
		return
	case err != nil:
		g.log.Warn("admin: runtime key not changed", "name", name, "action", action, "err", err)
		adminError(w, http.StatusServiceUnavailable, "the runtime keys' store cannot be written right now: "+err.Error())
		return
	}
	g.keysChanged(ctx, ev)
	if secret == "" {
		writeJSON(w, http.StatusOK, g.viewOf(k, now))
		return
	}
	writeJSON(w, http.StatusOK, IssuedKey{Key: secret, Note: "the new key is shown this once; the old one is refused from now on",
		Record: g.viewOf(k, now)})
}

// revokeKey serves POST /admin/keys/{name}/revoke: the key is refused from
// the next request on, on every replica within the poll interval; its
// streams already open finish.
func (g *Gateway) revokeKey(w http.ResponseWriter, r *http.Request) {
	who, _ := actor(r)
	g.changeKey(w, r, "revoke", func(k *keystore.Key, now time.Time) error {
		if !k.Revoked.IsZero() {
			return errKeyState(strconv.Quote(k.Name) + " was revoked already, at " + k.Revoked.Format(time.RFC3339))
		}
		k.Revoked, k.RevokedBy = now.Truncate(time.Second), who
		return nil
	}, "")
}

// rotateKey serves POST /admin/keys/{name}/rotate: a new secret for the
// same key (name, team, limits and spend unchanged); the old secret is
// refused from then on. An optional body {"expires_in": …} or
// {"expires_at": …} sets a new expiry.
func (g *Gateway) rotateKey(w http.ResponseWriter, r *http.Request) {
	req, err := decodeKeyRequest(w, r, true)
	if err == nil && (req.Name != "" || req.Team != "" || !req.Limits.IsZero() || req.Labels != nil) {
		err = errors.New("a rotation takes only expires_at or expires_in: revoke the key and create another to change the rest")
	}
	var exp time.Time
	if err == nil {
		exp, err = req.expiry(g.now())
	}
	if err != nil {
		adminError(w, http.StatusBadRequest, err.Error())
		return
	}
	secret, sum, err := keystore.Secret()
	if err != nil {
		adminError(w, http.StatusInternalServerError, err.Error())
		return
	}
	g.changeKey(w, r, "rotate", func(k *keystore.Key, now time.Time) error {
		if !k.Revoked.IsZero() {
			return errKeyState(strconv.Quote(k.Name) + " is revoked: create a new key instead")
		}
		keystore.Rotate(k, sum, now.Truncate(time.Second))
		if !exp.IsZero() {
			k.Expires = exp
		}
		return nil
	}, secret)
}

// keysAudit serves GET /admin/keys/audit?limit=N (default 100, at most
// keystore.MaxAudit): the changes, newest first.
func (g *Gateway) keysAudit(w http.ResponseWriter, r *http.Request) {
	limit := defaultAudit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > keystore.MaxAudit {
			adminError(w, http.StatusBadRequest, "limit must be a whole number from 1 to "+strconv.Itoa(keystore.MaxAudit))
			return
		}
		limit = n
	}
	ctx, cancel := context.WithTimeout(r.Context(), adminTimeout)
	defer cancel()
	evs, err := g.keys.Store().Audit(ctx, limit)
	if err != nil {
		adminError(w, http.StatusServiceUnavailable, "the runtime keys' audit log cannot be read right now: "+err.Error())
		return
	}
	if evs == nil {
		evs = []keystore.Event{}
	}
	writeJSON(w, http.StatusOK, AuditReport{Events: evs})
}
