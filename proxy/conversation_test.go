package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/conversation"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
)

// conversationsOn turns [conversations] on in a world's config.
func conversationsOn(c *config.Config) {
	c.Conversations.Enabled = true
}

// sumTurns folds records as the store should: every admitted request a turn.
func sumTurns(key string, recs ...llm.Record) conversation.Conversation {
	var c conversation.Conversation
	for i := range recs {
		r := &recs[i]
		c.Turns++
		if r.Outcome != llm.OutcomeOK {
			c.Errors++
		}
		c.Tokens.Add(conversation.Tokens{Input: r.Usage.Input, Output: r.Usage.Output,
			CacheRead: r.Usage.CacheRead, CacheWrite: r.Usage.CacheWrite, Reasoning: r.Usage.Reasoning})
		c.CostMicros += r.CostMicros
		c.TTFTs = append(c.TTFTs, r.TTFT())
	}
	c.Key = key
	return c
}

// wantConversation checks the store's figures of key against recs.
func wantConversation(t *testing.T, w *govWorld, key, team string, recs ...llm.Record) conversation.Conversation {
	t.Helper()
	got, err := w.conv.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("conversation %s: %v", key, err)
	}
	want := sumTurns(key, recs...)
	if got.Turns != want.Turns || got.Errors != want.Errors || got.Tokens != want.Tokens ||
		got.CostMicros != want.CostMicros || got.Team != team || len(got.TTFTs) != len(want.TTFTs) {
		t.Fatalf("conversation %+v\nwant the sum of its records %+v (team %s)", got, want, team)
	}
	for i, d := range want.TTFTs {
		if got.TTFTs[i] != d {
			t.Errorf("turn %d TTFT %v, record says %v", i, got.TTFTs[i], d)
		}
	}
	return got
}

// Turns named by the header, through both SDKs and both dialects, are one
// conversation of the caller's team whose figures are the sum of the
// turns' records; the same id from another team is another conversation,
// and a request without the header is in none.
func TestConversationFromHeaderSumsItsTurns(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 4}, false, conversationsOn)
	ctx := testCtx(t)
	hdr := option.WithHeader("X-Conversation-Id", "support-4711")
	var recs []llm.Record
	for range 2 {
		stream := w.openai(keyAlpha, hdr).Chat.Completions.NewStreaming(ctx, chatParams(16))
		for stream.Next() {
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		_ = stream.Close()
		recs = append(recs, w.tg.record(t))
	}
	if _, err := w.openai(keyAlpha, hdr).Chat.Completions.New(ctx, chatParams(16)); err != nil {
		t.Fatal(err)
	}
	recs = append(recs, w.tg.record(t))
	ac := w.anthropic(keyAlpha, aoption.WithHeader("X-Conversation-Id", "support-4711"))
	stream := ac.Messages.NewStreaming(ctx, messageParams(16))
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	recs = append(recs, w.tg.record(t))

	// Another team, the same id; and no id at all.
	if _, err := w.openai(keyBeta, hdr).Chat.Completions.New(ctx, chatParams(16)); err != nil {
		t.Fatal(err)
	}
	other := w.tg.record(t)
	if _, err := w.openai(keyAlpha).Chat.Completions.New(ctx, chatParams(16)); err != nil {
		t.Fatal(err)
	}
	w.tg.record(t)

	c := wantConversation(t, w, conversation.Key("team:search", "support-4711"), "search", recs...)
	if c.Turns != 4 || c.CostMicros == 0 || c.TTFTs[0] <= 0 {
		t.Errorf("conversation %+v: want 4 priced turns, the first streamed with a TTFT", c)
	}
	wantConversation(t, w, conversation.Key("team:ads", "support-4711"), "ads", other)
	if n := w.conv.Active(); n != 2 {
		t.Errorf("%d conversations, want 2 (the request without an id is in none)", n)
	}
}

// The W3C baggage entry session.id names a conversation when the header
// does not; the header wins over it.
func TestBaggageSessionIDNamesAConversation(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   string
	}{
		{[]string{"session.id=abc"}, "abc"},
		{[]string{"userId=alice, session.id = s%2F1 ;prop=1,other=x"}, "s/1"},
		{[]string{"a=b", "session.id=second-header"}, "second-header"},
		{[]string{"session.idx=no"}, ""},
		{[]string{"session.id=%zz"}, ""},
		{nil, ""},
	} {
		if got := baggageSessionID(tc.values); got != tc.want {
			t.Errorf("baggageSessionID(%q) = %q, want %q", tc.values, got, tc.want)
		}
	}
	w := newGovWorld(t, mockllm.Options{OutputTokens: 2}, false, conversationsOn)
	ctx := testCtx(t)
	bag := option.WithHeader("Baggage", "session.id=sess-1")
	for _, opts := range [][]option.RequestOption{{bag}, {bag, option.WithHeader("X-Conversation-Id", "hdr-1")}} {
		if _, err := w.openai(keyAlpha, opts...).Chat.Completions.New(ctx, chatParams(8)); err != nil {
			t.Fatal(err)
		}
	}
	first, second := w.tg.record(t), w.tg.record(t)
	wantConversation(t, w, conversation.Key("team:search", "sess-1"), "search", first)
	wantConversation(t, w, conversation.Key("team:search", "hdr-1"), "search", second)
}

// A conversation id the store cannot take is refused with a 400 in the
// caller's dialect, before anything goes upstream.
func TestConversationIDTooLongIsRefused(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{}, false, conversationsOn)
	long := strings.Repeat("x", conversation.MaxIDLen+1)
	_, err := w.openai(keyAlpha, option.WithHeader("X-Conversation-Id", long)).Chat.Completions.New(testCtx(t), chatParams(8))
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusBadRequest || !strings.Contains(oe.Message, "X-Conversation-Id") {
		t.Fatalf("too long an id: %v", err)
	}
	if rec := w.tg.record(t); rec.Outcome != llm.OutcomeBadRequest || rec.AttemptCount != 0 {
		t.Errorf("record %+v", rec)
	}
	if n := w.mock.Stats().Requests; n != 0 {
		t.Errorf("the upstream got %d requests", n)
	}
}

// A Responses API chain is one conversation without any header: named by
// its first response, streamed turns and non-streamed ones alike; a
// request with "store": false continues no chain.
func TestResponsesChainIsOneConversation(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, conversationsOn)
	ctx := testCtx(t)
	oc := w.openai(keyAlpha)
	p := responses.ResponseNewParams{Model: "gpt-test-1",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}, MaxOutputTokens: openai.Int(32)}
	var recs []llm.Record
	var first, prev string
	for i := range 4 {
		if prev != "" {
			p.PreviousResponseID = openai.String(prev)
		}
		var id string
		if i%2 == 0 {
			stream := oc.Responses.NewStreaming(ctx, p)
			for stream.Next() {
				if ev := stream.Current(); ev.Type == "response.completed" {
					id = ev.Response.ID
				}
			}
			if err := stream.Err(); err != nil {
				t.Fatal(err)
			}
			_ = stream.Close()
		} else {
			resp, err := oc.Responses.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			id = resp.ID
		}
		if id == "" || id == prev {
			t.Fatalf("turn %d: response id %q after %q", i, id, prev)
		}
		if first == "" {
			first = id
		}
		prev = id
		recs = append(recs, w.tg.record(t))
	}
	c := wantConversation(t, w, conversation.Key("team:search", first), "search", recs...)
	if c.Turns != 4 {
		t.Errorf("chain of 4 turns is %d", c.Turns)
	}
	// The first response's id is the conversation's name in the admin API.
	if n := w.conv.Active(); n != 1 {
		t.Errorf("%d conversations, want the chain's one", n)
	}
	p.PreviousResponseID = openai.String(prev)
	p.Store = openai.Bool(false)
	if _, err := oc.Responses.New(ctx, p); err != nil {
		t.Fatal(err)
	}
	recs = append(recs, w.tg.record(t))
	wantConversation(t, w, conversation.Key("team:search", first), "search", recs...)
}

// A team's max_cost_per_conversation_usd refuses the turn whose estimate
// would take its conversation past it, with a 429 insufficient_quota the
// SDKs read as final, naming the conversation's budget; another
// conversation of the team goes on, and a refused turn is not a turn.
func TestConversationBudgetRefusesTheTurnPastIt(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 10}, false, func(c *config.Config) {
		conversationsOn(c)
		// A turn of chatParams(100) is estimated at about 1,000 µ$ of
		// output and costs about 100 µ$: three fit under 1,300 µ$.
		c.Teams[0].MaxCostPerConversationUSD = f64(0.0013)
	})
	ctx := testCtx(t)
	hdr := option.WithHeader("X-Conversation-Id", "budgeted")
	var recs []llm.Record
	var refused *openai.Error
	for i := range 10 {
		_, err := w.openai(keyAlpha, hdr).Chat.Completions.New(ctx, chatParams(100))
		rec := w.tg.record(t)
		if err != nil {
			if !errors.As(err, &refused) {
				t.Fatalf("turn %d: %v", i, err)
			}
			if rec.Rejection != llm.RejectCostPerConversation || rec.AttemptCount != 0 {
				t.Errorf("refused turn record %+v", rec)
			}
			break
		}
		recs = append(recs, rec)
	}
	if refused == nil || refused.StatusCode != http.StatusTooManyRequests || refused.Code != "insufficient_quota" ||
		!strings.Contains(refused.Message, "Conversation budget") ||
		refused.Response.Header.Get("X-Should-Retry") != "false" {
		t.Fatalf("refusal: %v", refused)
	}
	c := wantConversation(t, w, conversation.Key("team:search", "budgeted"), "search", recs...)
	if len(recs) < 2 || !strings.Contains(refused.Message, "Used "+usd(c.CostMicros)+" by this conversation (") {
		t.Errorf("refused after %d turns costing %s: %s", len(recs), usd(c.CostMicros), refused.Message)
	}
	// Another conversation of the same team, and a team without the budget.
	if _, err := w.openai(keyAlpha, option.WithHeader("X-Conversation-Id", "fresh")).Chat.Completions.New(ctx, chatParams(100)); err != nil {
		t.Errorf("another conversation: %v", err)
	}
	w.tg.record(t)
	ac := w.anthropic(keyAlpha, aoption.WithHeader("X-Conversation-Id", "budgeted"))
	_, err := ac.Messages.New(ctx, messageParams(100))
	var ae *anthropic.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusTooManyRequests || !strings.Contains(ae.Error(), "Conversation budget") {
		t.Errorf("Anthropic caller past the budget: %v", err)
	}
	w.tg.record(t)
	if got := metricValue(t, w.tg, "tollgate_ratelimit_rejections_total",
		map[string]string{"scope": "conversation", "limit": "cost_per_conversation", "team": "search"}); got != 2 {
		t.Errorf("rejections counted %v, want 2", got)
	}
}

// conversationAPI sends one request to the conversation API and decodes
// an error's code.
func conversationAPI(t *testing.T, w *govWorld, method, path, body string, hdr map[string]string) (int, string, []byte) {
	t.Helper()
	status, b := send(t, method, w.tg.URL+path, body, hdr)
	code, atype := errorCode(b)
	if code == "" {
		code = atype
	}
	return status, code, b
}

// send sends one JSON request and returns its status and body.
func send(t *testing.T, method, url, body string, hdr map[string]string) (int, []byte) {
	t.Helper()
	res := sendRequest(testCtx(t), method, url, "application/json", body, hdr)
	if res.err != nil {
		t.Fatalf("%s %s: %v", method, url, res.err)
	}
	return res.resp.StatusCode, res.body
}

// The outcome API records the application's verdict once, with the
// caller's gateway key (whose team owns the conversation) or the admin
// token naming the team, hands it with the conversation's team and cost to
// OnOutcome, and gives every bad request a clear 4xx: a bad body, an
// unknown id, another team's key, a missing or unknown key.
func TestConversationOutcomeAPI(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		conversationsOn(c)
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	ctx := testCtx(t)
	if _, err := w.openai(keyAlpha, option.WithHeader("X-Conversation-Id", "task/42")).Chat.Completions.New(ctx, chatParams(8)); err != nil {
		t.Fatal(err)
	}
	rec := w.tg.record(t)
	path := "/tollgate/conversations/task%2F42/outcome"
	alpha := map[string]string{"Authorization": "Bearer " + keyAlpha}
	for _, tc := range []struct {
		name, path, body string
		hdr              map[string]string
		status           int
		code             string
	}{
		{"no key", path, `{"completed":true}`, nil, 401, "invalid_api_key"},
		{"unknown key", path, `{"completed":true}`, map[string]string{"Authorization": "Bearer tg-nobody-000000000"}, 401, "invalid_api_key"},
		{"wrong admin token", path + "?team=search", `{"completed":true}`, map[string]string{"Authorization": "Bearer not-the-admin-token"}, 401, "invalid_api_key"},
		{"not JSON", path, `completed`, alpha, 400, ""},
		{"two documents", path, `{"completed":true}{}`, alpha, 400, ""},
		{"no completed", path, `{"score":0.5}`, alpha, 400, ""},
		{"completed not a bool", path, `{"completed":"yes"}`, alpha, 400, ""},
		{"score above 1", path, `{"completed":true,"score":1.5}`, alpha, 400, ""},
		{"score below 0", path, `{"completed":true,"score":-0.1}`, alpha, 400, ""},
		{"unknown field", path, `{"completed":true,"rating":5}`, alpha, 400, ""},
		{"feedback too long", path, `{"completed":true,"feedback":"` + strings.Repeat("x", conversation.MaxFeedbackLen+1) + `"}`, alpha, 400, ""},
		{"body too large", path, `{"completed":true,"feedback":"` + strings.Repeat("x", maxOutcomeBody) + `"}`, alpha, 413, "request_too_large"},
		{"unknown id", "/tollgate/conversations/task-43/outcome", `{"completed":true}`, alpha, 404, "conversation_not_found"},
		{"another team's key", path, `{"completed":true}`, map[string]string{"Authorization": "Bearer " + keyBeta}, 404, "conversation_not_found"},
		{"admin naming another team", path + "?team=ads", `{"completed":true}`, map[string]string{"Authorization": "Bearer " + adminToken}, 404, "conversation_not_found"},
		{"admin naming no such team", path + "?team=nope", `{"completed":true}`, map[string]string{"Authorization": "Bearer " + adminToken}, 400, ""},
		{"GET", path, ``, alpha, 405, "method_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, code, body := conversationAPI(t, w, methodOf(tc.name), tc.path, tc.body, tc.hdr)
			if status != tc.status || tc.code != "" && code != tc.code {
				t.Errorf("%d %s %s; want %d %s", status, code, body, tc.status, tc.code)
			}
		})
	}
	select {
	case o := <-w.outcomes:
		t.Fatalf("a refused outcome reached OnOutcome: %+v", o)
	default:
	}

	status, _, body := conversationAPI(t, w, "POST", path, `{"completed":true,"score":0.8,"feedback":"fixed the printer"}`, alpha)
	if status != 200 || !strings.Contains(string(body), `"turns": 1`) || !strings.Contains(string(body), `"feedback": "fixed the printer"`) {
		t.Fatalf("outcome: %d %s", status, body)
	}
	got := await(t, w.outcomes, "the outcome")
	if got.team != "search" || !got.o.Completed || got.o.Score == nil || *got.o.Score != 0.8 || got.costMicros != rec.CostMicros {
		t.Errorf("OnOutcome got %+v (score %v); want team search, completed, 0.8, cost %d", got, got.o.Score, rec.CostMicros)
	}
	// Once only, whoever asks.
	status, code, _ := conversationAPI(t, w, "POST", path+"?team=search", `{"completed":false}`,
		map[string]string{"Authorization": "Bearer " + adminToken})
	if status != 409 || code != "outcome_already_recorded" {
		t.Errorf("second outcome: %d %s", status, code)
	}
	// The admin API shows it with the figures.
	status, _, body = conversationAPI(t, w, "GET", "/admin/conversations/task%2F42?key=alpha", "",
		map[string]string{"Authorization": "Bearer " + adminToken})
	if status != 200 || !strings.Contains(string(body), `"completed": true`) || !strings.Contains(string(body), `"id": "task/42"`) {
		t.Errorf("admin GET: %d %s", status, body)
	}
}

// methodOf is the method a table case's name asks for: GET for "GET", else POST.
func methodOf(name string) string {
	if name == "GET" {
		return http.MethodGet
	}
	return http.MethodPost
}

// GET /admin/conversations/{id} answers one active conversation's
// figures, as its records give them, behind the admin token; 404 for an
// unknown one or another team's, 400 for a team that does not exist, and
// with conversations off a 404 that says so.
func TestAdminConversationShowsItsFigures(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		conversationsOn(c)
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	ctx := testCtx(t)
	hdr := option.WithHeader("X-Conversation-Id", "c-1")
	var cost int64
	for range 2 {
		stream := w.openai(keyAlpha, hdr).Chat.Completions.NewStreaming(ctx, chatParams(8))
		for stream.Next() {
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		_ = stream.Close()
		cost += w.tg.record(t).CostMicros
	}
	admin := map[string]string{"Authorization": "Bearer " + adminToken}
	var rep ConversationReport
	status, body := send(t, "GET", w.tg.URL+"/admin/conversations/c-1?team=search", "", admin)
	if status != 200 || json.Unmarshal(body, &rep) != nil {
		t.Fatalf("admin GET: %d %s", status, body)
	}
	if rep.ID != "c-1" || rep.Key != conversation.Key("team:search", "c-1") || rep.Team != "search" || rep.Turns != 2 ||
		rep.CostMicros != cost || len(rep.TTFTMs) != 2 || rep.TTFTMs[0] == nil || *rep.TTFTMs[0] <= 0 || rep.Outcome != nil {
		t.Errorf("report %s", body)
	}
	for _, tc := range []struct {
		path   string
		hdr    map[string]string
		status int
	}{
		{"/admin/conversations/c-1?team=search", nil, 401},
		{"/admin/conversations/c-2?team=search", admin, 404},
		{"/admin/conversations/c-1?team=ads", admin, 404},
		{"/admin/conversations/c-1", admin, 404}, // callers without a key entry
		{"/admin/conversations/c-1?team=nope", admin, 400},
		{"/admin/conversations/c-1?team=search&key=alpha", admin, 400},
	} {
		if status, body := send(t, "GET", w.tg.URL+tc.path, "", tc.hdr); status != tc.status {
			t.Errorf("GET %s: %d %s, want %d", tc.path, status, body, tc.status)
		}
	}

	off := newGovWorld(t, mockllm.Options{}, false, func(c *config.Config) {
		c.Admin.TokenEnv, c.Admin.Token = "ADMIN_TOKEN", adminToken
	})
	for _, p := range []string{"/admin/conversations/c-1", "/tollgate/conversations/c-1/outcome"} {
		method := "GET"
		if strings.HasSuffix(p, "outcome") {
			method = "POST"
		}
		status, body := send(t, method, off.tg.URL+p, `{"completed":true}`, admin)
		if code, _ := errorCode(body); status != 404 || code != "conversations_off" {
			t.Errorf("%s with conversations off: %d %s", p, status, body)
		}
	}
}

// Turns of one conversation sent at once each hold their estimate against
// its budget until they finish, so together they cannot take it past the
// budget either.
func TestConcurrentTurnsHoldTheConversationBudget(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 10, TTFT: 300 * time.Millisecond}, false, func(c *config.Config) {
		conversationsOn(c)
		// About 1,000 µ$ estimated and 100 µ$ spent per turn.
		c.Teams[0].MaxCostPerConversationUSD = f64(0.0011)
	})
	ctx := testCtx(t)
	hdr := option.WithHeader("X-Conversation-Id", "parallel")
	const n = 20
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() { _, _ = w.openai(keyAlpha, hdr).Chat.Completions.New(ctx, chatParams(100)) })
	}
	wg.Wait()
	refused := 0
	for range n {
		if rec := w.tg.record(t); rec.Rejection == llm.RejectCostPerConversation {
			refused++
		}
	}
	c, err := w.conv.Get(context.Background(), conversation.Key("team:search", "parallel"))
	if err != nil {
		t.Fatal(err)
	}
	if c.CostMicros > 1100 || c.Turns < 1 || int(c.Turns)+refused != n {
		t.Errorf("%d turns cost %d µ$ against a budget of 1100, %d refused", c.Turns, c.CostMicros, refused)
	}
	// Every hold was given back: a next turn is checked on the spend alone.
	if held := w.tg.gw.convHolds.m; len(held) != 0 {
		t.Errorf("holds left after every turn finished: %v", held)
	}
}

// A Responses turn that starts its conversation (no header, nothing it
// continues) is checked against the budget too.
func TestChainStartIsCheckedAgainstTheBudget(t *testing.T) {
	w := newGovWorld(t, mockllm.Options{OutputTokens: 3}, false, func(c *config.Config) {
		conversationsOn(c)
		c.Teams[0].MaxCostPerConversationUSD = f64(0.001)
	})
	p := responses.ResponseNewParams{Model: "gpt-test-1",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}, MaxOutputTokens: openai.Int(1000)}
	_, err := w.openai(keyAlpha).Responses.New(testCtx(t), p)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusTooManyRequests || !strings.Contains(oe.Message, "Conversation budget") {
		t.Fatalf("a chain's first turn estimated at $0.01 against a $0.001 budget: %v", err)
	}
	if rec := w.tg.record(t); rec.Rejection != llm.RejectCostPerConversation {
		t.Errorf("record %+v", rec)
	}
	p.MaxOutputTokens = openai.Int(20)
	if _, err := w.openai(keyAlpha).Responses.New(testCtx(t), p); err != nil {
		t.Errorf("a first turn within the budget: %v", err)
	}
	w.tg.record(t)
}
