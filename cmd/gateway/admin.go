package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tollgate-llm/tollgate/proxy"
)

// stdin is the hash-key command's input; tests replace it.
var stdin io.Reader = os.Stdin

func runHashKey(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("hash-key",
		"Prints the SHA-256 of a gateway key, for the sha256 of a [[keys]] table. The key is read\n"+
			"from the first line of standard input (never from the command line, which shells keep\n"+
			"in their history):\n\n"+
			"    printf %s \"$KEY\" | gateway hash-key\n\n"+
			"With -generate, a new random key is made and printed with its hash; give the key to\n"+
			"its owner and put only the hash in gateway.toml.", stderr)
	gen := fs.Bool("generate", false, "generate a new random key and print it with its hash")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	var key string
	if *gen {
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		key = "tg-" + hex.EncodeToString(b)
		fmt.Fprintf(stdout, "key:    %s\n", key)
	} else {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("reading the key from standard input: %w", err)
		}
		key = strings.TrimRight(line, "\r\n")
		if strings.TrimSpace(key) != key || key == "" {
			return errors.New("the key on standard input is empty or has surrounding spaces; callers' keys are used as sent")
		}
	}
	sum := sha256.Sum256([]byte(key))
	if *gen {
		fmt.Fprintf(stdout, "sha256: %s\n", hex.EncodeToString(sum[:]))
		return nil
	}
	fmt.Fprintln(stdout, hex.EncodeToString(sum[:]))
	return nil
}

func runSpend(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("spend",
		"Prints what keys and teams spent, from a running gateway's GET /admin/spend, as a table\n"+
			"(or its JSON with -json). The admin token is read from the variable -token-env names.\n"+
			"With -limits, prints GET /admin/limits instead: each key's and team's limits, used,\n"+
			"remaining and reset.", stderr)
	base := fs.String("url", "http://127.0.0.1:8080", "the gateway's base URL")
	tokenEnv := fs.String("token-env", "TOLLGATE_ADMIN_TOKEN", "environment variable holding the admin token")
	team := fs.String("team", "", "only this team")
	key := fs.String("key", "", "only this key (its [[keys]] name or hash id)")
	model := fs.String("model", "", "only this model")
	from := fs.String("from", "", "first day, YYYY-MM-DD (UTC)")
	to := fs.String("to", "", "last day, YYYY-MM-DD (UTC)")
	asJSON := fs.Bool("json", false, "print the JSON the gateway returned")
	limits := fs.Bool("limits", false, "print limits instead of spend")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	token := os.Getenv(*tokenEnv)
	if token == "" {
		return fmt.Errorf("$%s is not set: it must hold the gateway's admin token", *tokenEnv)
	}
	q := url.Values{}
	for k, v := range map[string]string{"team": *team, "key": *key, "model": *model, "from": *from, "to": *to} {
		if v != "" {
			q.Set(k, v)
		}
	}
	path := "/admin/spend"
	if *limits {
		path = "/admin/limits"
	}
	u := strings.TrimRight(*base, "/") + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	body, err := adminGet(u, token)
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := stdout.Write(body)
		return err
	}
	if *limits {
		var rep proxy.LimitsReport
		if err := json.Unmarshal(body, &rep); err != nil {
			return fmt.Errorf("decoding %s: %w", path, err)
		}
		return printLimits(stdout, rep)
	}
	var rep proxy.SpendReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return fmt.Errorf("decoding %s: %w", path, err)
	}
	return printSpend(stdout, rep)
}

// adminGet fetches an admin endpoint and returns its body, or an error with
// the gateway's message.
func adminGet(u, token string) ([]byte, error) {
	return adminCall(http.MethodGet, u, token, nil)
}

// adminCall sends an admin request with body (nil: none) and returns the
// answer's body, or an error with the gateway's message.
func adminCall(method, u, token string, body []byte) ([]byte, error) {
	return adminCallAs(method, u, token, "", body)
}

// adminCallAs is adminCall saying who makes the request (X-Tollgate-Actor,
// for the audit log; "" says nothing). Any 2xx answer is a success.
func adminCallAs(method, u, token, actor string, body []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if actor != "" {
		req.Header.Set("X-Tollgate-Actor", actor)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Message string } `json:"error"`
		}
		msg := strings.TrimSpace(string(answer))
		if json.Unmarshal(answer, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		return nil, fmt.Errorf("%s: %s: %s", u, resp.Status, msg)
	}
	return answer, nil
}

func printSpend(w io.Writer, rep proxy.SpendReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "day\tteam\tkey\tmodel\trequests\tinput\toutput\tcache read\tcache write\treasoning\tcost USD\t")
	row := func(r proxy.SpendRow) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t\n", r.Day, dash(r.Team), r.KeyID, r.Model,
			r.Requests, r.InputTokens, r.OutputTokens, r.CacheReadTokens, r.CacheWriteTokens, r.ReasoningTokens,
			microsUSD(r.CostMicros))
	}
	for _, r := range rep.Rows {
		row(r)
	}
	t := rep.Total
	t.Day, t.KeyID, t.Model = "total", "", ""
	row(t)
	if err := tw.Flush(); err != nil {
		return err
	}
	if rep.Partial {
		_, err := fmt.Fprintf(w, "partial: %s\n", rep.Note)
		return err
	}
	return nil
}

func printLimits(w io.Writer, rep proxy.LimitsReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scope\tid\tteam\tlimit\tmax\tused\treserved\tremaining\treset\t")
	for _, s := range rep.Subjects {
		for _, l := range s.Limits {
			amount := func(n int64) string { return strconv.FormatInt(n, 10) }
			if strings.HasPrefix(l.Limit, "cost_") {
				amount = microsUSD
			}
			max, used, res, rem := amount(l.Max), amount(l.Used), amount(l.Reserved), amount(l.Remaining)
			reset := "-"
			if l.ResetSeconds > 0 {
				reset = (time.Duration(l.ResetSeconds * float64(time.Second))).Round(time.Second).String()
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Scope, s.ID, dash(s.Team), l.Limit, max, used, res,
				rem, reset)
		}
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// microsUSD renders micro-dollars exactly, as dollars with six decimals.
func microsUSD(m int64) string {
	sign := ""
	if m < 0 {
		sign, m = "-", -m
	}
	return fmt.Sprintf("%s%d.%06d", sign, m/1e6, m%1e6)
}
