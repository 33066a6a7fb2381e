package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/keystore"
	"github.com/tollgate-llm/tollgate/proxy"
)

// keysCommands are the subcommands of `gateway keys`, each a call of the
// runtime keys' admin API.
var keysCommands = []struct{ name, summary string }{
	{"create", "issue a key: gateway keys create -name NAME [-team T] [limits] [-expires-in D] [-label k=v]"},
	{"list", "list every key, [[keys]] tables and runtime keys"},
	{"show", "show one key: gateway keys show NAME"},
	{"revoke", "revoke a runtime key: gateway keys revoke NAME"},
	{"rotate", "give a runtime key a new secret: gateway keys rotate NAME [-expires-in D]"},
	{"audit", "print the audit log of runtime keys, newest first"},
}

func keysUsage(w io.Writer) {
	fmt.Fprintln(w, "Usage: gateway keys <command> [flags] [name]\n\nIssues and revokes gateway keys at runtime through a running gateway's admin API\n"+
		"(/admin/keys; [runtime_keys] enabled). The admin token is read from $TOLLGATE_ADMIN_TOKEN\n"+
		"(-token-env). A new key is printed once; only its SHA-256 is kept.\n\nCommands:")
	for _, c := range keysCommands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
}

// keysClient is what every keys subcommand needs to call the admin API.
type keysClient struct {
	base, token, actor string
}

// call sends an admin request with the actor header and returns the body.
func (c *keysClient) call(method, path string, body []byte) ([]byte, error) {
	return adminCallAs(method, strings.TrimRight(c.base, "/")+path, c.token, c.actor, body)
}

func runKeys(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		keysUsage(stderr)
		if len(args) == 0 {
			return errUsage
		}
		return flag.ErrHelp
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("keys "+sub, "", stderr)
	base := fs.String("url", "http://127.0.0.1:8080", "the gateway's base URL")
	tokenEnv := fs.String("token-env", "TOLLGATE_ADMIN_TOKEN", "environment variable holding the admin token")
	actor := fs.String("actor", defaultActor(), "who is making the change, for the audit log")
	asJSON := fs.Bool("json", false, "print the JSON the gateway returned")
	var req proxy.KeyRequest
	var limit int
	var positional bool
	switch sub {
	case "create":
		fs.StringVar(&req.Name, "name", "", "the key's name: a-z, 0-9, _ and - (required)")
		fs.StringVar(&req.Team, "team", "", "the [[teams]] name the key belongs to")
		limitFlags(fs, &req)
		fs.StringVar(&req.ExpiresIn, "expires-in", "", "the key stops working after this long (720h)")
		fs.StringVar(&req.ExpiresAt, "expires-at", "", "the key stops working at this RFC 3339 time")
		fs.Func("label", "a label k=v (repeatable), e.g. -label email=ana@example.com", func(s string) error {
			k, v, ok := strings.Cut(s, "=")
			if !ok {
				return errors.New("a label is k=v")
			}
			if req.Labels == nil {
				req.Labels = map[string]string{}
			}
			req.Labels[k] = v
			return nil
		})
	case "rotate":
		fs.StringVar(&req.ExpiresIn, "expires-in", "", "a new expiry, from now (720h)")
		fs.StringVar(&req.ExpiresAt, "expires-at", "", "a new expiry, an RFC 3339 time")
		positional = true
	case "show", "revoke":
		positional = true
	case "list":
	case "audit":
		fs.IntVar(&limit, "limit", 100, "how many events, newest first")
	default:
		fmt.Fprintf(stderr, "gateway keys: unknown command %q\n\n", sub)
		keysUsage(stderr)
		return errUsage
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return errUsage
	}
	var name string
	switch {
	case positional && fs.NArg() == 1:
		name = fs.Arg(0)
	case positional:
		fmt.Fprintf(stderr, "gateway keys %s needs the key's name: gateway keys %s NAME\n", sub, sub)
		return errUsage
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "unexpected arguments: %s\n", strings.Join(fs.Args(), " "))
		return errUsage
	}
	token := os.Getenv(*tokenEnv)
	if token == "" {
		return fmt.Errorf("$%s is not set: it must hold the gateway's admin token", *tokenEnv)
	}
	c := &keysClient{base: *base, token: token, actor: *actor}
	var body []byte
	var err error
	path := "/admin/keys"
	method := http.MethodGet
	switch sub {
	case "create":
		if req.Name == "" {
			return errors.New("-name is required")
		}
		method = http.MethodPost
		body, err = c.call(method, path, mustJSON(req))
	case "rotate":
		method = http.MethodPost
		var doc []byte
		if req.ExpiresIn != "" || req.ExpiresAt != "" {
			doc = mustJSON(req)
		}
		body, err = c.call(method, path+"/"+url.PathEscape(name)+"/rotate", doc)
	case "revoke":
		body, err = c.call(http.MethodPost, path+"/"+url.PathEscape(name)+"/revoke", nil)
	case "show":
		body, err = c.call(method, path+"/"+url.PathEscape(name), nil)
	case "list":
		body, err = c.call(method, path, nil)
	case "audit":
		body, err = c.call(method, path+"/audit?limit="+strconv.Itoa(limit), nil)
	}
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	return printKeysAnswer(stdout, sub, body)
}

// limitFlags adds a flag per limit; a limit not given stays unset (no
// limit), as in a [[keys]] table.
func limitFlags(fs *flag.FlagSet, req *proxy.KeyRequest) {
	intFlag := func(name, usage string, p **int64) {
		fs.Func(name, usage, func(s string) error {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil {
				return errors.New("not a whole number")
			}
			*p = &n
			return nil
		})
	}
	usdFlag := func(name, usage string, p **float64) {
		fs.Func(name, usage, func(s string) error {
			x, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return errors.New("not a number")
			}
			*p = &x
			return nil
		})
	}
	intFlag("rpm", "requests per minute", &req.RPM)
	intFlag("tpm", "tokens per minute", &req.TPM)
	intFlag("concurrency", "requests open at once", &req.Concurrency)
	intFlag("tokens-per-day", "tokens per UTC day", &req.TokensPerDay)
	usdFlag("cost-per-day-usd", "US dollars per UTC day", &req.CostPerDayUSD)
	usdFlag("cost-per-month-usd", "US dollars per UTC month", &req.CostPerMonthUSD)
	intFlag("count-tokens-rpm", "token counts per minute", &req.CountTokensRPM)
}

// defaultActor names the user running the command, for the audit log.
func defaultActor() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		if h, err := os.Hostname(); err == nil {
			return u.Username + "@" + h
		}
		return u.Username
	}
	return ""
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // a KeyRequest always encodes
	}
	return b
}

// printKeysAnswer prints an admin answer for people.
func printKeysAnswer(w io.Writer, sub string, body []byte) error {
	switch sub {
	case "create", "rotate":
		var iss proxy.IssuedKey
		if err := json.Unmarshal(body, &iss); err != nil {
			return fmt.Errorf("decoding the answer: %w", err)
		}
		fmt.Fprintf(w, "key:    %s\n", iss.Key)
		fmt.Fprintf(w, "note:   %s\n\n", iss.Note)
		return printKeyViews(w, []proxy.KeyView{iss.Record})
	case "show", "revoke":
		var v proxy.KeyView
		if err := json.Unmarshal(body, &v); err != nil {
			return fmt.Errorf("decoding the answer: %w", err)
		}
		return printKeyViews(w, []proxy.KeyView{v})
	case "list":
		var rep proxy.KeysReport
		if err := json.Unmarshal(body, &rep); err != nil {
			return fmt.Errorf("decoding the answer: %w", err)
		}
		return printKeyViews(w, rep.Keys)
	}
	var rep proxy.AuditReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("decoding the answer: %w", err)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "time\taction\tname\tteam\tkey id\tactor\tremote")
	for _, e := range rep.Events {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.UTC().Format(time.RFC3339), e.Action, e.Name, dash(e.Team),
			e.SHA256[:min(12, len(e.SHA256))], dash(e.Actor), dash(e.Remote))
	}
	return tw.Flush()
}

func printKeyViews(w io.Writer, keys []proxy.KeyView) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "name\tid\tsource\tstatus\tteam\tlimits\texpires\tcreated by\tlabels")
	for _, k := range keys {
		exp := "-"
		if !k.Expires.IsZero() {
			exp = k.Expires.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.Name, k.ID, k.Source, k.Status, dash(k.Team),
			limitsText(k), exp, dash(k.CreatedBy), labelsText(k.Labels))
	}
	return tw.Flush()
}

// limitsText lists a key's limits as rpm=60,tokens_per_day=1000000.
func limitsText(k proxy.KeyView) string {
	var parts []string
	i := func(name string, p *int64) {
		if p != nil {
			parts = append(parts, name+"="+strconv.FormatInt(*p, 10))
		}
	}
	f := func(name string, p *float64) {
		if p != nil {
			parts = append(parts, name+"="+strconv.FormatFloat(*p, 'f', -1, 64))
		}
	}
	i("rpm", k.RPM)
	i("tpm", k.TPM)
	i("concurrency", k.Concurrency)
	i("tokens_per_day", k.TokensPerDay)
	f("cost_per_day_usd", k.CostPerDayUSD)
	f("cost_per_month_usd", k.CostPerMonthUSD)
	i("count_tokens_rpm", k.CountTokensRPM)
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func labelsText(labels map[string]string) string {
	if len(labels) == 0 {
		return "-"
	}
	b, _ := json.Marshal(labels) // sorted by name
	return string(b)
}

// printRuntimeKeys lists, after check-config's effective configuration, the
// runtime keys its store holds (Redis, or the state file), or says why it
// cannot: the [[keys]] tables are in the configuration above, and a
// runtime key of the same name as one of them is marked shadowed (the file
// wins). The check itself does not depend on it.
func printRuntimeKeys(w io.Writer, cfg *config.Config) {
	if !cfg.RuntimeKeys.Enabled {
		return
	}
	snap, where, err := readRuntimeKeys(cfg)
	if err != nil {
		fmt.Fprintf(w, "\n# Runtime keys: cannot read %s: %v\n", where, err)
		return
	}
	fmt.Fprintf(w, "\n# Runtime keys in %s (version %d): %d\n", where, snap.Version, len(snap.Keys))
	now := time.Now()
	for _, k := range snap.Keys {
		status := k.Status(now)
		if cfg.KeyBySHA256(k.SHA256) != nil || slices.ContainsFunc(cfg.Keys, func(c config.Key) bool { return c.Name == k.Name }) {
			status = "shadowed by a [[keys]] table"
		}
		fmt.Fprintf(w, "#   %s  id %s  team %s  %s\n", k.Name, k.SHA256[:min(12, len(k.SHA256))], dash(k.Team), status)
	}
}

// readRuntimeKeys reads the runtime keys' store of cfg, read-only.
func readRuntimeKeys(cfg *config.Config) (keystore.Snapshot, string, error) {
	if !cfg.UsesRedis() {
		file := cfg.RuntimeKeys.StateFile
		if file == "" {
			return keystore.Snapshot{}, "memory", errors.New(`[runtime_keys] state_file is "": the keys live in the running gateway only`)
		}
		snap, err := keystore.ReadLocalSnapshot(file)
		return snap, file, err
	}
	rc := cfg.Redis
	opts := &redis.UniversalOptions{Addrs: rc.Addrs, MasterName: rc.MasterName, Username: rc.Username,
		Password: rc.Password.Reveal(), DB: rc.DB, DialTimeout: config.Millis(rc.DialTimeoutMs),
		ReadTimeout: config.Millis(rc.TimeoutMs), WriteTimeout: config.Millis(rc.TimeoutMs), MaxRetries: -1,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}}
	if rc.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	client := redis.NewUniversalClient(opts)
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), config.Millis(rc.DialTimeoutMs)+config.Millis(rc.TimeoutMs))
	defer cancel()
	snap, err := keystore.NewRedis(client, rc.KeyPrefix).Snapshot(ctx)
	return snap, "Redis " + strings.Join(rc.Addrs, ","), err
}
