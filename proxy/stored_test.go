package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/packages/ssestream"
	"github.com/openai/openai-go/v3/responses"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-llm/tollgate/config"
	"github.com/tollgate-llm/tollgate/internal/redistest"
	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/ownership"
	"github.com/tollgate-llm/tollgate/spend"
)

func TestStoredPathNamesTheObject(t *testing.T) {
	cases := []struct {
		method, path string
		want         storedUse
	}{
		{"GET", "/v1/responses/resp_1", storedUse{kind: storedResponse, id: "resp_1"}},
		{"DELETE", "/v1/responses/resp_1", storedUse{kind: storedResponse, id: "resp_1", release: true}},
		{"POST", "/v1/responses/resp_1/cancel", storedUse{kind: storedResponse, id: "resp_1"}},
		{"GET", "/v1/responses/resp_1/input_items", storedUse{kind: storedResponse, id: "resp_1"}},
		{"DELETE", "/v1/responses/resp_1/input_items", storedUse{kind: storedResponse, id: "resp_1"}},
		{"GET", "/v1/responses/input_tokens/x", storedUse{kind: storedResponse, id: "input_tokens"}},
		{"POST", "/v1/responses/input_tokens", storedUse{}},
		{"POST", "/v1/responses/compact", storedUse{}},
		{"POST", "/v1/responses", storedUse{}},
		{"GET", "/v1/responses/", storedUse{}},
		{"POST", "/v1/conversations", storedUse{kind: storedConversation, create: true}},
		{"GET", "/v1/conversations", storedUse{}},
		{"GET", "/v1/conversations/conv_1", storedUse{kind: storedConversation, id: "conv_1"}},
		{"POST", "/v1/conversations/conv_1", storedUse{kind: storedConversation, id: "conv_1"}},
		{"DELETE", "/v1/conversations/conv_1", storedUse{kind: storedConversation, id: "conv_1", release: true}},
		{"POST", "/v1/conversations/conv_1/items", storedUse{kind: storedConversation, id: "conv_1"}},
		{"DELETE", "/v1/conversations/conv_1/items/msg_2", storedUse{kind: storedConversation, id: "conv_1"}},
		{"DELETE", "/v1/responses/resp_1/", storedUse{kind: storedResponse, id: "resp_1"}},
		{"DELETE", "/v1/conversations/conv_1/", storedUse{kind: storedConversation, id: "conv_1"}},
		{"POST", "/v1/conversations/", storedUse{}},
		{"GET", "/v1/responses//x", storedUse{}},
		{"GET", "/v1/files/file_1", storedUse{}},
		{"GET", "/v2/responses/resp_1", storedUse{}},
		// Escaped: the upstream may split the path otherwise, so it names
		// nothing here (and stays refused in mode "keys").
		{"GET", "/v1/responses/resp_1%2Fcancel", storedUse{}},
	}
	for _, c := range cases {
		u, err := url.Parse(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := storedPath(c.method, u); got != c.want {
			t.Errorf("%s %s: %+v, want %+v", c.method, c.path, got, c.want)
		}
	}
}

func TestReplayIsAStreamedGetOfOneResponse(t *testing.T) {
	cases := []struct {
		method, target, body string
		want                 bool
	}{
		// openai-go's GetStreaming: the flag in the GET's body.
		{"GET", "/v1/responses/resp_1?starting_after=2", `{"stream":true}`, true},
		{"GET", "/v1/responses/resp_1", `{"stream":false}`, false},
		{"GET", "/v1/responses/resp_1", `{"stream":"true"}`, false},
		{"GET", "/v1/responses/resp_1?stream=false", `{"stream":true}`, false},
		{"GET", "/v1/responses/resp_1?stream=true", "", true},
		{"GET", "/v1/responses/resp_1?stream=true&starting_after=4", "", true},
		{"GET", "/v1/responses/resp_1?stream=1", "", true},
		{"GET", "/v1/responses/resp_1", "", false},
		{"GET", "/v1/responses/resp_1?stream=false", "", false},
		{"GET", "/v1/responses/resp_1?stream=yes", "", false},
		{"GET", "/v1/responses/resp_1/input_items?stream=true", "", false},
		{"POST", "/v1/responses/resp_1?stream=true", "", false},
		{"GET", "/v1/conversations/conv_1?stream=true", "", false},
	}
	for _, c := range cases {
		r, err := http.NewRequest(c.method, "http://gw"+c.target, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		if got := isReplay(r); got != c.want {
			t.Errorf("%s %s %s: replay %v, want %v", c.method, c.target, c.body, got, c.want)
		}
		// The body is still the request's, whole.
		if b, err := io.ReadAll(r.Body); err != nil || string(b) != c.body {
			t.Errorf("%s %s: body after the check %q %v, want %q", c.method, c.target, b, err, c.body)
		}
	}
}

// storedKeyGamma is a key without a team: its stored state is its own.
const storedKeyGamma = "tg-test-gamma-0123456789"

// storedGateway is a gateway in mode "keys" (alpha in team search, beta in
// team ads, gamma without a team) in front of upURL, keeping owners in
// owners (a private in-memory store when nil).
func storedGateway(t testing.TB, upURL string, owners ownership.Store) *testGateway {
	t.Helper()
	return newTestGatewayWith(t, upURL, func(c *config.Config) {
		c.Auth.Mode = "keys"
		c.Upstreams[0].APIKeyEnv = "UPSTREAM_KEY"
		c.Upstreams[0].APIKey = upstreamKey
		c.Teams = []config.Team{{Name: "search"}, {Name: "ads"}}
		c.Keys = []config.Key{
			{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"},
			{Name: "beta", SHA256: sha(keyBeta), Team: "ads"},
			{Name: "gamma", SHA256: sha(storedKeyGamma)},
		}
	}, func(o *Options) { o.Owners = owners })
}

// storedMock is a mockllm that needs the upstream key, and its URL.
func storedMock(t *testing.T) (*mockllm.Server, string) {
	t.Helper()
	return mockUpstream(t, mockllm.Options{OutputTokens: 4, RequireKey: upstreamKey})
}

func storedClient(tg *testGateway, key string) *openai.Client {
	c := openai.NewClient(option.WithBaseURL(tg.URL+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
	return &c
}

func storedParams() responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: "gpt-test",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is stored here?")}}
}

// upstreamSaw counts the requests the mock received on path.
func upstreamSaw(mock *mockllm.Server, method, path string) int {
	n := 0
	for _, r := range mock.Requests() {
		if r.Method == method && r.Path == path {
			n++
		}
	}
	return n
}

// wantNotFound checks that err is the SDK's view of a 404 with code (""
// for null) and that the upstream never saw method path.
func wantNotFound(t *testing.T, what string, err error, code string, mock *mockllm.Server, method, path string) {
	t.Helper()
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusNotFound || oe.Code != code ||
		!strings.Contains(oe.Message, "not found") {
		t.Errorf("%s: %v, want a 404 (code %q) the SDK parses", what, err, code)
	}
	if n := upstreamSaw(mock, method, path); n != 0 {
		t.Errorf("%s: the upstream saw %s %s %d times, want never", what, method, path, n)
	}
}

// drain reads a stream to its end and returns its terminal response.
func drain(t *testing.T, s *ssestream.Stream[responses.ResponseStreamEventUnion]) *responses.Response {
	t.Helper()
	defer s.Close()
	var final *responses.Response
	for s.Next() {
		if ev := s.Current(); ev.Type == "response.completed" {
			r := ev.Response
			final = &r
		}
	}
	if err := s.Err(); err != nil || final == nil {
		t.Fatalf("stream: %v (terminal %v)", err, final != nil)
	}
	return final
}

func TestStoredResponseIsOnlyItsTeams(t *testing.T) {
	mock, up := storedMock(t)
	tg := storedGateway(t, up, nil)
	ctx := testCtx(t)
	alpha, beta, gamma := storedClient(tg, keyAlpha), storedClient(tg, keyBeta), storedClient(tg, storedKeyGamma)

	plain, err := alpha.Responses.New(ctx, storedParams())
	if err != nil {
		t.Fatal(err)
	}
	streamed := drain(t, alpha.Responses.NewStreaming(ctx, storedParams()))
	for _, id := range []string{plain.ID, streamed.ID} {
		p := "/v1/responses/" + id
		_, err := beta.Responses.Get(ctx, id, responses.ResponseGetParams{})
		wantNotFound(t, "another team's GET", err, "", mock, "GET", p)
		_, err = beta.Responses.InputItems.List(ctx, id, responses.InputItemListParams{})
		wantNotFound(t, "another team's input_items", err, "", mock, "GET", p+"/input_items")
		_, err = beta.Responses.Cancel(ctx, id)
		wantNotFound(t, "another team's cancel", err, "", mock, "POST", p+"/cancel")
		err = beta.Responses.Delete(ctx, id)
		wantNotFound(t, "another team's DELETE", err, "", mock, "DELETE", p)
		_, err = gamma.Responses.Get(ctx, id, responses.ResponseGetParams{})
		wantNotFound(t, "a key without a team", err, "", mock, "GET", p)
		replay := beta.Responses.GetStreaming(ctx, id, responses.ResponseGetParams{})
		for replay.Next() {
		}
		wantNotFound(t, "another team's replay", replay.Err(), "", mock, "GET", p)
		_ = replay.Close()

		chained := storedParams()
		chained.PreviousResponseID = openai.String(id)
		before := upstreamSaw(mock, "POST", "/v1/responses")
		_, err = beta.Responses.New(ctx, chained)
		wantNotFound(t, "chaining onto another team's response", err, "previous_response_not_found", mock, "", "")
		s := beta.Responses.NewStreaming(ctx, chained)
		for s.Next() {
		}
		wantNotFound(t, "a stream chaining onto another team's response", s.Err(), "previous_response_not_found",
			mock, "", "")
		_ = s.Close()
		if n := upstreamSaw(mock, "POST", "/v1/responses") - before; n != 0 {
			t.Errorf("chained requests of another team reached the upstream %d times", n)
		}
		resp, body := post(t, tg.URL+"/v1/responses/input_tokens",
			`{"model":"gpt-test","input":"x","previous_response_id":"`+id+`"}`,
			map[string]string{"Authorization": "Bearer " + keyBeta})
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "previous_response_not_found") {
			t.Errorf("input_tokens with another team's response: %d %s", resp.StatusCode, body)
		}

		// Its own team: every path goes through.
		got, err := alpha.Responses.Get(ctx, id, responses.ResponseGetParams{})
		if err != nil || got.ID != id || got.OutputText() == "" {
			t.Errorf("own GET: %v %+v", err, got)
		}
		if _, err := alpha.Responses.InputItems.List(ctx, id, responses.InputItemListParams{}); err != nil {
			t.Errorf("own input_items: %v", err)
		}
		next, err := alpha.Responses.New(ctx, chained)
		if err != nil || next.PreviousResponseID != id {
			t.Errorf("own chain: %v", err)
		}
		own, err := alpha.Responses.InputTokens.Count(ctx, responses.InputTokenCountParams{
			PreviousResponseID: openai.String(id), Input: responses.InputTokenCountParamsInputUnion{OfString: openai.String("x")}})
		if err != nil || own.InputTokens <= 0 {
			t.Errorf("own input_tokens count: %v %+v", err, own)
		}
	}
	// Deleted by its team: the owner is forgotten, so no one gets it again.
	if err := alpha.Responses.Delete(ctx, plain.ID); err != nil {
		t.Fatal(err)
	}
	_, err = alpha.Responses.Get(ctx, plain.ID, responses.ResponseGetParams{})
	wantNotFound(t, "GET after DELETE", err, "", mock, "", "")
	if n := upstreamSaw(mock, "GET", "/v1/responses/"+plain.ID); n != 1 {
		t.Errorf("upstream saw %d GETs of the deleted response, want the 1 before the delete", n)
	}

	// Not stored: nobody can name it, and nothing was recorded.
	unstored := storedParams()
	unstored.Store = openai.Bool(false)
	u, err := alpha.Responses.New(ctx, unstored)
	if err != nil {
		t.Fatal(err)
	}
	_, err = alpha.Responses.Get(ctx, u.ID, responses.ResponseGetParams{})
	wantNotFound(t, "an unstored response", err, "", mock, "GET", "/v1/responses/"+u.ID)

	// Refusals are rejections "not_owner".
	var refused int
	tg.mu.Lock()
	recs := append([]llm.Record(nil), tg.recs...)
	tg.mu.Unlock()
	for _, rec := range recs {
		if rec.Rejection == llm.RejectNotOwner {
			refused++
			if rec.Outcome != llm.OutcomeRejected || rec.Status != http.StatusNotFound {
				t.Errorf("not-owner record %+v", rec)
			}
		}
	}
	if want := 2*9 + 2; refused != want {
		t.Errorf("%d not-owner records, want %d", refused, want)
	}
}

func TestStoredConversationIsOnlyItsTeams(t *testing.T) {
	mock, up := storedMock(t)
	tg := storedGateway(t, up, nil)
	ctx := testCtx(t)
	alpha, beta := storedClient(tg, keyAlpha), storedClient(tg, keyBeta)
	conv, err := alpha.Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	p := "/v1/conversations/" + conv.ID
	item := []responses.ResponseInputItemUnionParam{responses.ResponseInputItemParamOfMessage("kept", responses.EasyInputMessageRoleUser)}
	_, err = beta.Conversations.Get(ctx, conv.ID)
	wantNotFound(t, "another team's conversation", err, "", mock, "GET", p)
	_, err = beta.Conversations.Update(ctx, conv.ID, conversations.ConversationUpdateParams{
		Metadata: map[string]string{"owner": "ads"}})
	wantNotFound(t, "updating another team's conversation", err, "", mock, "POST", p)
	_, err = beta.Conversations.Items.New(ctx, conv.ID, conversations.ItemNewParams{Items: item})
	wantNotFound(t, "adding to another team's conversation", err, "", mock, "POST", p+"/items")
	_, err = beta.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{})
	wantNotFound(t, "listing another team's conversation", err, "", mock, "GET", p+"/items")
	_, err = beta.Conversations.Delete(ctx, conv.ID)
	wantNotFound(t, "deleting another team's conversation", err, "", mock, "DELETE", p)
	joined := storedParams()
	joined.Conversation = responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)}
	before := upstreamSaw(mock, "POST", "/v1/responses")
	_, err = beta.Responses.New(ctx, joined)
	wantNotFound(t, "a response in another team's conversation", err, "", mock, "", "")
	joined.Conversation = responses.ResponseNewParamsConversationUnion{
		OfConversationObject: &responses.ResponseConversationParam{ID: conv.ID}}
	_, err = beta.Responses.New(ctx, joined)
	wantNotFound(t, "the same, the conversation as an object", err, "", mock, "", "")
	if n := upstreamSaw(mock, "POST", "/v1/responses") - before; n != 0 {
		t.Errorf("another team's responses in the conversation reached the upstream %d times", n)
	}

	// Its own team uses it, and its responses in it are its own too.
	if _, err := alpha.Conversations.Items.New(ctx, conv.ID, conversations.ItemNewParams{Items: item}); err != nil {
		t.Errorf("own items: %v", err)
	}
	r, err := alpha.Responses.New(ctx, joined)
	if err != nil {
		t.Fatalf("own response in the conversation: %v", err)
	}
	list, err := alpha.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{})
	if err != nil || len(list.Data) < 3 {
		t.Errorf("own conversation's items: %v (%d items, want the added one, the input and the answer)", err, len(list.Data))
	}
	_, err = beta.Responses.Get(ctx, r.ID, responses.ResponseGetParams{})
	wantNotFound(t, "another team's response in a conversation", err, "", mock, "GET", "/v1/responses/"+r.ID)
	if _, err := alpha.Conversations.Delete(ctx, conv.ID); err != nil {
		t.Fatal(err)
	}
	_, err = alpha.Conversations.Get(ctx, conv.ID)
	wantNotFound(t, "a deleted conversation", err, "", mock, "", "")
	if n := upstreamSaw(mock, "GET", p); n != 0 {
		t.Errorf("the upstream saw %d GETs of the conversation, want none", n)
	}
}

func TestStoredOwnersSurviveACrash(t *testing.T) {
	mock, up := storedMock(t)
	file := filepath.Join(t.TempDir(), "owners.jsonl")
	first, err := ownership.NewLocal(ownership.LocalOptions{File: file})
	if err != nil {
		t.Fatal(err)
	}
	tg := storedGateway(t, up, first)
	ctx := testCtx(t)
	plain, err := storedClient(tg, keyAlpha).Responses.New(ctx, storedParams())
	if err != nil {
		t.Fatal(err)
	}
	streamed := drain(t, storedClient(tg, keyAlpha).Responses.NewStreaming(ctx, storedParams()))
	// The first gateway dies without closing its store: what it claimed
	// was journalled before the ids reached the caller.
	second, err := ownership.NewLocal(ownership.LocalOptions{File: file})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = second.Close(); _ = first.Close() })
	again := storedGateway(t, up, second)
	for _, id := range []string{plain.ID, streamed.ID} {
		if got, err := storedClient(again, keyAlpha).Responses.Get(ctx, id, responses.ResponseGetParams{}); err != nil || got.ID != id {
			t.Errorf("own response %s after the restart: %v", id, err)
		}
		_, err := storedClient(again, keyBeta).Responses.Get(ctx, id, responses.ResponseGetParams{})
		wantNotFound(t, "another team's response after the restart", err, "", mock, "", "")
	}
}

// TestAnswerNamingAnotherTeamsObjectIsWithheld: two gateways share the
// owners' store in front of two upstreams that number their responses
// alike, as an upstream that repeats ids (or answers for another account)
// would. Team ads' answers name ids team search owns: they are withheld,
// streamed and not, with a 502 the SDK parses; the ids stay search's; the
// non-streamed answer's usage is billed all the same (the upstream spent
// it), and the record says why.
func TestAnswerNamingAnotherTeamsObjectIsWithheld(t *testing.T) {
	_, up1 := storedMock(t)
	_, up2 := storedMock(t)
	owners, err := ownership.NewLocal(ownership.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owners.Close() })
	first, second := storedGateway(t, up1, owners), storedGateway(t, up2, owners)
	ctx := testCtx(t)
	plain, err := storedClient(first, keyAlpha).Responses.New(ctx, storedParams())
	if err != nil {
		t.Fatal(err)
	}
	first.record(t)
	streamed := drain(t, storedClient(first, keyAlpha).Responses.NewStreaming(ctx, storedParams()))
	first.record(t)
	if plain.ID == streamed.ID {
		t.Fatalf("the mock repeated id %s itself", plain.ID)
	}

	wantConflict := func(what string, err error) llm.Record {
		t.Helper()
		var oe *openai.Error
		if !errors.As(err, &oe) || oe.StatusCode != http.StatusBadGateway || oe.Code != "stored_id_conflict" {
			t.Errorf("%s: %v, want a 502 stored_id_conflict", what, err)
		}
		rec := second.record(t)
		if rec.Status != http.StatusBadGateway || rec.ErrorType != "stored_id_conflict" ||
			rec.Interruption != llm.InterruptProtocolError || rec.Outcome != llm.OutcomeUpstreamError {
			t.Errorf("%s: record status %d, error %q, interruption %v, outcome %v", what, rec.Status, rec.ErrorType,
				rec.Interruption, rec.Outcome)
		}
		return rec
	}
	_, err = storedClient(second, keyBeta).Responses.New(ctx, storedParams())
	if rec := wantConflict("non-streamed", err); rec.Usage.Output == 0 || rec.Usage.Input == 0 {
		t.Errorf("non-streamed: the withheld answer's usage was not billed: %+v", rec.Usage)
	}
	s := storedClient(second, keyBeta).Responses.NewStreaming(ctx, storedParams())
	for s.Next() {
		t.Errorf("streamed: the caller got event %q", s.Current().Type)
	}
	wantConflict("streamed", s.Err())
	_ = s.Close()

	for _, id := range []string{plain.ID, streamed.ID} {
		if holder, err := owners.Owner(ctx, id); err != nil || holder != "team:search" {
			t.Errorf("%s is owned by %q (%v), want team:search still", id, holder, err)
		}
		if _, err := storedClient(first, keyAlpha).Responses.Get(ctx, id, responses.ResponseGetParams{}); err != nil {
			t.Errorf("search's own %s: %v", id, err)
		}
	}
}

// TestCommittedStreamNamingAnotherTeamsResponseEnds: an upstream whose
// opening outgrows the hold (here 40 KiB of SSE comments), so the stream is
// the caller's before response.created comes, names a response another
// team owns: that event is not written; an error event ends the stream.
func TestCommittedStreamNamingAnotherTeamsResponseEnds(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		pad := ": " + strings.Repeat("k", 1000) + "\n\n"
		for range 40 {
			_, _ = io.WriteString(w, pad)
		}
		_, _ = io.WriteString(w, "event: response.created\ndata: "+
			`{"type":"response.created","sequence_number":0,"response":{"id":"resp_owned","object":"response","status":"in_progress","model":"gpt-test","output":[]}}`+"\n\n")
		_, _ = io.WriteString(w, "event: response.output_text.delta\ndata: "+
			`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"secret"}`+"\n\n")
	}))
	t.Cleanup(up.Close)
	owners, err := ownership.NewLocal(ownership.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = owners.Close() })
	ctx := testCtx(t)
	if holder, err := owners.Claim(ctx, "resp_owned", "team:search", time.Hour); err != nil || holder != "team:search" {
		t.Fatalf("claim: %q %v", holder, err)
	}
	tg := storedGateway(t, up.URL, owners)
	s := storedClient(tg, keyBeta).Responses.NewStreaming(ctx, storedParams())
	for s.Next() {
		t.Errorf("the caller got event %q", s.Current().Type)
	}
	if s.Err() == nil {
		t.Error("the stream ended without an error")
	}
	_ = s.Close()
	rec := tg.record(t)
	if rec.ErrorType != "stored_id_conflict" || rec.Interruption != llm.InterruptProtocolError {
		t.Errorf("record: error %q, interruption %v", rec.ErrorType, rec.Interruption)
	}
	if holder, _ := owners.Owner(ctx, "resp_owned"); holder != "team:search" {
		t.Errorf("resp_owned now owned by %q", holder)
	}
}

func TestStoredOwnersAreSharedByReplicas(t *testing.T) {
	mock, up := storedMock(t)
	srv := redistest.Start(t)
	replica := func() *testGateway {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		return storedGateway(t, up, ownership.NewRedis(c, "tollgate:own:"))
	}
	one, two := replica(), replica()
	ctx := testCtx(t)
	streamed := drain(t, storedClient(one, keyAlpha).Responses.NewStreaming(ctx, storedParams()))
	conv, err := storedClient(one, keyBeta).Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := storedClient(two, keyAlpha).Responses.Get(ctx, streamed.ID, responses.ResponseGetParams{}); err != nil || got.ID != streamed.ID {
		t.Errorf("own response through the other replica: %v", err)
	}
	if _, err := storedClient(two, keyBeta).Conversations.Get(ctx, conv.ID); err != nil {
		t.Errorf("own conversation through the other replica: %v", err)
	}
	_, err = storedClient(two, keyBeta).Responses.Get(ctx, streamed.ID, responses.ResponseGetParams{})
	wantNotFound(t, "another team's response through the other replica", err, "", mock, "", "")
	_, err = storedClient(two, keyAlpha).Conversations.Get(ctx, conv.ID)
	wantNotFound(t, "another team's conversation through the other replica", err, "", mock, "", "")
	if err := storedClient(two, keyAlpha).Responses.Delete(ctx, streamed.ID); err != nil {
		t.Fatal(err)
	}
	_, err = storedClient(one, keyAlpha).Responses.Get(ctx, streamed.ID, responses.ResponseGetParams{})
	wantNotFound(t, "a response deleted through the other replica", err, "", mock, "", "")

	// Redis down: nothing is let through unchecked.
	srv.Kill()
	_, err = storedClient(one, keyBeta).Conversations.Get(ctx, conv.ID)
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusServiceUnavailable || oe.Code != "ownership_unavailable" {
		t.Errorf("owner lookup with Redis down: %v, want 503 ownership_unavailable", err)
	}
}

func TestReplayIsMeasuredAsAStreamAndNotBilled(t *testing.T) {
	mock, up := mockUpstream(t, mockllm.Options{OutputTokens: 6})
	ledger := newLocalLedger(t)
	tg := newTestGatewayWith(t, up, nil, func(o *Options) { o.Ledger = ledger })
	ctx := testCtx(t)
	c := storedClient(tg, "sk-caller")
	p := storedParams()
	p.Background = openai.Bool(true)
	created := drain(t, c.Responses.NewStreaming(ctx, p))
	if rec := tg.record(t); rec.Route != llm.RouteResponses || rec.Usage.Output != created.Usage.OutputTokens {
		t.Fatalf("creation record %+v", rec)
	}

	// openai-go asks with {"stream":true} in the GET's body.
	replayed := drain(t, c.Responses.GetStreaming(ctx, created.ID, responses.ResponseGetParams{}))
	if replayed.ID != created.ID || replayed.OutputText() != created.OutputText() {
		t.Errorf("replayed %q %q, want %q %q", replayed.ID, replayed.OutputText(), created.ID, created.OutputText())
	}
	rec := tg.record(t)
	if rec.Route != llm.RouteResponsesRetrieve || !rec.Stream || rec.Outcome != llm.OutcomeOK ||
		rec.TokenEvents != int(created.Usage.OutputTokens) || rec.Usage.Output != created.Usage.OutputTokens ||
		rec.Timing.FirstTokenOut.IsZero() || rec.CostMicros != 0 {
		t.Errorf("replay record %+v", rec)
	}

	// The query's form, resumed: relayed byte for byte as the upstream sent it.
	target := "/v1/responses/" + created.ID + "?stream=true&starting_after=3"
	get := func(base string) string {
		res := sendRequest(ctx, "GET", base+target, "", "", map[string]string{"Authorization": "Bearer sk-caller"})
		if res.err != nil || res.resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %v %v", base, res.resp, res.err)
		}
		return string(res.body)
	}
	through := get(tg.URL)
	if direct := get(up); through != direct || !strings.Contains(direct, `"sequence_number":4`) ||
		strings.Contains(direct, `"sequence_number":3,`) {
		t.Errorf("resumed replay differs from the upstream's, or did not resume:\n%s\nwant\n%s", through, direct)
	}
	if rec := tg.record(t); rec.Route != llm.RouteResponsesRetrieve || rec.Outcome != llm.OutcomeOK {
		t.Errorf("resumed replay record %+v", rec)
	}
	rows, err := ledger.Query(ctx, spend.Filter{})
	if err != nil || len(rows) != 1 || rows[0].Requests != 1 || rows[0].Output != created.Usage.OutputTokens {
		t.Errorf("ledger %+v %v: want the creation alone", rows, err)
	}
	if n := upstreamSaw(mock, "GET", "/v1/responses/"+created.ID); n != 3 {
		t.Errorf("upstream saw %d GETs, want 3", n)
	}
	wantMetric(t, tg, "tollgate_inflight_requests", map[string]string{"route": "responses_retrieve"}, 0)
}

// BenchmarkStoredState measures what tenant isolation adds to a request in
// mode "keys": "check" is the owner lookup of a request naming a stored
// response (a GET of it, or previous_response_id), "claim" the record of a
// new response's owner when the upstream creates one. memory and journal
// are the in-process store (without and with its state file), redis the
// shared one on a private redis-server over loopback.
func BenchmarkStoredState(b *testing.B) {
	for _, backend := range []string{"memory", "journal", "redis"} {
		var owners ownership.Store
		switch backend {
		case "memory":
			owners, _ = ownership.NewLocal(ownership.LocalOptions{})
		case "journal":
			l, err := ownership.NewLocal(ownership.LocalOptions{File: filepath.Join(b.TempDir(), "owners.jsonl")})
			if err != nil {
				b.Fatal(err)
			}
			owners = l
		case "redis":
			owners = ownership.NewRedis(redistest.Start(b).Client(b), "tollgate:own:")
		}
		g := bareGatewayWith(b, "http://127.0.0.1:1", func(c *config.Config) {
			c.Auth.Mode = "keys"
			c.Teams = []config.Team{{Name: "search"}}
			c.Keys = []config.Key{{Name: "alpha", SHA256: sha(keyAlpha), Team: "search"}}
		}, func(o *Options) { o.Owners = owners })
		r := httptest.NewRequest(http.MethodGet, "/v1/responses/resp_bench", nil)
		newExchange := func() *exchange {
			ex := &exchange{g: g, gen: g.gen.Load(), r: r}
			ex.rec.Route = llm.RouteResponses
			if _, aerr := ex.identify(presented{bearer: keyHash(keyAlpha)}); aerr != nil {
				b.Fatal(aerr)
			}
			return ex
		}
		newExchange().claimID(storedResponse, "resp_bench")
		b.Run(backend+"/check", func(b *testing.B) {
			ex := newExchange()
			ex.stored = storedPath(r.Method, r.URL)
			b.ReportAllocs()
			for b.Loop() {
				if rf := ex.checkStored(); !rf.ok() {
					b.Fatal(rf.err)
				}
			}
		})
		b.Run(backend+"/claim", func(b *testing.B) {
			ex := newExchange()
			id := []byte("resp_00000000000000000000000000000000000000000000000000")
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				n++
				for i, v := len(id)-1, n; v > 0; i, v = i-1, v/10 { // a new id each time, same length
					id[i] = byte('0' + v%10)
				}
				if ex.claimID(storedResponse, string(id)) {
					b.Fatal("a new id is another team's")
				}
			}
		})
		_ = owners.Close()
	}
}

// TestStoredStateHasNoOtherSpelling: another team's response can be named
// by no other spelling of the Responses API's path: an escaped letter is
// refused at the door, and a spelling the gateway does not route as the
// Responses API still has its body's references checked.
func TestStoredStateHasNoOtherSpelling(t *testing.T) {
	mock, up := storedMock(t)
	tg := storedGateway(t, up, nil)
	ctx := testCtx(t)
	own, err := storedClient(tg, keyAlpha).Responses.New(ctx, storedParams())
	if err != nil {
		t.Fatal(err)
	}
	before := len(mock.Requests())
	body := `{"model":"gpt-test","input":"x","previous_response_id":"` + own.ID + `"}`
	for path, want := range map[string]int{
		"/v1/respons%65s": http.StatusBadRequest, // refused at the door
		"/v1/Responses":   http.StatusNotFound,   // forwarded spelling: its references are checked
		"/v1/responses;x": http.StatusBadRequest,
	} {
		resp, got := rawRequest(t, strings.TrimPrefix(tg.URL, "http://"), "POST "+path+" HTTP/1.1\r\nHost: gw\r\n"+
			"Authorization: Bearer "+keyBeta+"\r\nContent-Type: application/json\r\nContent-Length: "+
			strconv.Itoa(len(body))+"\r\nConnection: close\r\n\r\n"+body)
		if resp.StatusCode != want {
			t.Errorf("POST %s chaining onto another team's response: %d %s, want %d", path, resp.StatusCode, got, want)
		}
	}
	if n := len(mock.Requests()) - before; n != 0 {
		t.Errorf("the upstream got %d of those requests, want none", n)
	}
}

// streamUntilCompleted opens a Responses stream as key and reads its events
// until response.completed, leaving the body open: it returns the new
// response's id, the event types read, and the body to read on.
func streamUntilCompleted(t testing.TB, tg *testGateway, key string) (id string, types []string, body io.ReadCloser) {
	t.Helper()
	req, err := http.NewRequestWithContext(testCtx(t), http.MethodPost, tg.URL+"/v1/responses",
		strings.NewReader(`{"model":"gpt-test","input":"What is stored here?","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		_ = resp.Body.Close()
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for len(types) == 0 || types[len(types)-1] != "response.completed" {
		line, err := br.ReadString('\n')
		if err != nil {
			_ = resp.Body.Close()
			t.Fatalf("the stream ended after %v: %v", types, err)
		}
		data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string `json:"type"`
			Response struct {
				ID string `json:"id"`
			} `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatalf("event %q: %v", data, err)
		}
		types = append(types, ev.Type)
		if ev.Type == "response.created" {
			id = ev.Response.ID
		}
	}
	return id, types, resp.Body
}

// TestStalledOwnershipStoreHoldsNoEvent: in mode "keys" a stream's new
// response is recorded as its team's, but a stalled Redis holds none of
// its events: with the ownership store's Redis stopped (SIGSTOP), the
// caller reads the whole stream, response.completed included; the claim
// lands once Redis answers again, the deferral is counted, and the
// response is then the team's through the gateway.
func TestStalledOwnershipStoreHoldsNoEvent(t *testing.T) {
	_, up := mockUpstream(t, mockllm.Options{OutputTokens: 4, RequireKey: upstreamKey, TTFT: 20 * time.Millisecond})
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	owners := ownership.NewRedis(c, "tollgate:own:")
	tg := storedGateway(t, up, owners)
	// A first stream, Redis healthy: its claim is made (normally before its
	// response.created goes out; how often a busy machine defers it is no
	// test's business).
	id, _, body := streamUntilCompleted(t, tg, keyAlpha)
	_, _ = io.Copy(io.Discard, body)
	_ = body.Close()
	tg.record(t)
	deferred := metricValue(t, tg, "tollgate_stored_claims_deferred_total", nil)
	ctx := testCtx(t)
	if holder, err := owners.Owner(ctx, id); err != nil || holder != "team:search" {
		t.Fatalf("healthy Redis: %s owned by %q (%v)", id, holder, err)
	}

	srv.Stall()
	id, types, body := streamUntilCompleted(t, tg, keyAlpha)
	srv.Resume() // only now: every event above reached the caller while Redis was stopped
	_, _ = io.Copy(io.Discard, body)
	_ = body.Close()
	if types[0] != "response.created" || !slices.Contains(types, "response.output_text.delta") {
		t.Errorf("events with Redis stalled: %v", types)
	}
	rec := tg.record(t)
	if rec.Outcome != llm.OutcomeOK || rec.TokenEvents != 4 {
		t.Errorf("record with Redis stalled: outcome %v, %d token events", rec.Outcome, rec.TokenEvents)
	}
	wantMetric(t, tg, "tollgate_stored_claims_deferred_total", nil, deferred+1)
	waitFor(t, "the deferred claim to land once Redis answers", func() bool {
		holder, err := owners.Owner(ctx, id)
		return err == nil && holder == "team:search"
	})
	if got, err := storedClient(tg, keyAlpha).Responses.Get(ctx, id, responses.ResponseGetParams{}); err != nil || got.ID != id {
		t.Errorf("the team's own response after the deferred claim: %v", err)
	}
	if _, err := storedClient(tg, keyBeta).Responses.Get(ctx, id, responses.ResponseGetParams{}); err == nil {
		t.Error("another team read the response of a deferred claim")
	}
}

// gatedOwners is an in-process ownership store whose claims wait for gate
// to close, and which notes an owner lookup made while a claim waits.
type gatedOwners struct {
	ownership.Store
	gate          chan struct{}
	waiting       atomic.Int32
	askedMidClaim atomic.Bool
}

// newGatedOwners is a gatedOwners over a new in-process store, and the
// function that opens its gate (once; the test's cleanup opens it too, so
// no claim outlives the test).
func newGatedOwners(t testing.TB) (*gatedOwners, func()) {
	t.Helper()
	owners := &gatedOwners{Store: newLocalOwners(t), gate: make(chan struct{})}
	var once sync.Once
	open := func() { once.Do(func() { close(owners.gate) }) }
	t.Cleanup(open)
	return owners, open
}

// newLocalOwners is a new in-process ownership store, closed in cleanup.
func newLocalOwners(t testing.TB) *ownership.Local {
	t.Helper()
	local, err := ownership.NewLocal(ownership.LocalOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = local.Close() })
	return local
}

func (o *gatedOwners) Claim(ctx context.Context, id, owner string, ttl time.Duration) (string, error) {
	o.waiting.Add(1)
	defer o.waiting.Add(-1)
	select {
	case <-o.gate:
	case <-ctx.Done():
		return "", ctx.Err()
	}
	return o.Store.Claim(ctx, id, owner, ttl)
}

func (o *gatedOwners) Owner(ctx context.Context, id string) (string, error) {
	if o.waiting.Load() > 0 {
		o.askedMidClaim.Store(true)
	}
	return o.Store.Owner(ctx, id)
}

// TestRequestRacingADeferredClaimWaitsForIt: a GET of a new response sent
// while the relay's claim of it is still in flight (the store slower than
// the relay waits) waits for that claim on this replica and is served as
// the owner's, instead of finding the response unowned (a 404).
func TestRequestRacingADeferredClaimWaitsForIt(t *testing.T) {
	mock, up := storedMock(t)
	owners, openGate := newGatedOwners(t)
	tg := storedGateway(t, up, owners)
	id, _, body := streamUntilCompleted(t, tg, keyAlpha) // its claim waits on the gate
	_, _ = io.Copy(io.Discard, body)                     // the stream ends; its claim goes on
	_ = body.Close()
	tg.record(t)
	type got struct {
		r   *responses.Response
		err error
	}
	done := make(chan got, 1)
	go func() {
		r, err := storedClient(tg, keyAlpha).Responses.Get(testCtx(t), id, responses.ResponseGetParams{})
		done <- got{r, err}
	}()
	// Give the GET the time to reach the gateway (ordering only: were it
	// late, the claim would be in the store and the test would prove less,
	// never fail).
	waitFor(t, "the GET's exchange to open", func() bool { return tg.gw.open.Load() == 1 || len(done) > 0 })
	time.Sleep(20 * time.Millisecond)
	openGate()
	res := await(t, done, "the GET")
	if res.err != nil || res.r.ID != id {
		t.Errorf("GET racing the claim: %v, want the response", res.err)
	}
	if owners.askedMidClaim.Load() {
		t.Error("the GET looked the owner up while the claim was in flight")
	}
	tg.record(t)
	if n := upstreamSaw(mock, "GET", "/v1/responses/"+id); n != 1 {
		t.Errorf("the upstream saw %d GETs, want 1", n)
	}
}

// BenchmarkStreamTTFTWithOwnershipStalled measures what a stalled
// ownership store costs a stream's first token in mode "keys": each
// iteration opens a Responses stream whose new response is claimed on a
// private redis-server over loopback, healthy or stopped (SIGSTOP) until
// the caller has read response.completed, and reports the gateway's TTFT
// (ttft-ms, the record's) and how many claims the relay went on without
// (deferred/op). ttft is the upstream's own first-token delay after
// response.created: at 0 the first token follows it at once, so any wait
// for the store shows in full.
func BenchmarkStreamTTFTWithOwnershipStalled(b *testing.B) {
	for _, ttft := range []time.Duration{0, 20 * time.Millisecond} {
		_, up := mockUpstream(b, mockllm.Options{OutputTokens: 4, RequireKey: upstreamKey, TTFT: ttft})
		srv := redistest.Start(b)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		b.Cleanup(func() { _ = c.Close() })
		tg := storedGateway(b, up, ownership.NewRedis(c, "tollgate:own:"))
		for _, stalled := range []bool{false, true} {
			b.Run(fmt.Sprintf("upstream_ttft=%v/redis_stalled=%v", ttft, stalled), func(b *testing.B) {
				deferredBefore := metricValue(b, tg, "tollgate_stored_claims_deferred_total", nil)
				var sum time.Duration
				for b.Loop() {
					if stalled {
						srv.Stall()
					}
					_, _, body := streamUntilCompleted(b, tg, keyAlpha)
					srv.Resume()
					_, _ = io.Copy(io.Discard, body)
					_ = body.Close()
					rec := tg.record(b)
					sum += rec.TTFT()
				}
				b.ReportMetric(float64(sum.Microseconds())/1000/float64(b.N), "ttft-ms")
				b.ReportMetric((metricValue(b, tg, "tollgate_stored_claims_deferred_total", nil)-deferredBefore)/float64(b.N), "deferred/op")
			})
		}
	}
}

// TestStreamEndDoesNotWaitForADeferredClaim: a claim slower than the
// relay's wait holds neither an event nor the stream's end: the caller
// reads its answer to the end of the body while the claim is still in
// flight, and the record is finished; the claim lands afterwards, and
// Gateway.Wait (shutdown) waits for it.
func TestStreamEndDoesNotWaitForADeferredClaim(t *testing.T) {
	_, up := storedMock(t)
	owners, openGate := newGatedOwners(t)
	tg := storedGateway(t, up, owners)
	id, _, body := streamUntilCompleted(t, tg, keyAlpha)
	_, _ = io.Copy(io.Discard, body) // to the end of the body
	_ = body.Close()
	rec := tg.record(t)
	if owners.waiting.Load() == 0 {
		t.Fatal("the stream's end waited for its claim")
	}
	if rec.Outcome != llm.OutcomeOK {
		t.Errorf("record outcome %v", rec.Outcome)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	if err := tg.gw.Wait(ctx); err == nil {
		t.Error("Wait returned with a claim in flight")
	}
	cancel()
	openGate()
	if err := tg.gw.Wait(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if holder, err := owners.Owner(testCtx(t), id); err != nil || holder != "team:search" {
		t.Errorf("%s owned by %q (%v) after the claim, want team:search", id, holder, err)
	}
}

// panickingOwners is an ownership store whose Claim panics, as a buggy
// store could.
type panickingOwners struct{ ownership.Store }

func (panickingOwners) Claim(context.Context, string, string, time.Duration) (string, error) {
	panic("ownership store bug")
}

// TestPanickingClaimFailsTheClaimNotTheGateway: a panic in the store while
// a stream's new response is recorded (off the handler, where no
// recoverer runs) counts as a failed claim: the stream is relayed whole,
// the id stays unowned (a 404 for everyone), and the gateway serves on.
func TestPanickingClaimFailsTheClaimNotTheGateway(t *testing.T) {
	_, up := storedMock(t)
	tg := storedGateway(t, up, panickingOwners{newLocalOwners(t)})
	ctx := testCtx(t)
	final := drain(t, storedClient(tg, keyAlpha).Responses.NewStreaming(ctx, storedParams()))
	if rec := tg.record(t); rec.Outcome != llm.OutcomeOK {
		t.Errorf("record outcome %v", rec.Outcome)
	}
	if err := tg.gw.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	_, err := storedClient(tg, keyAlpha).Responses.Get(ctx, final.ID, responses.ResponseGetParams{})
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusNotFound {
		t.Errorf("GET of the response whose claim panicked: %v, want a 404", err)
	}
}

// TestLateConflictKeepsTheResponseItsOwners: an upstream names a response
// another team owns, and the claim that finds it answers only after the
// whole stream reached the caller (a store slower than the relay waits,
// here one held until the caller has drained the stream).
// The answer cannot be withheld any more, but the id stays its owner's:
// the caller cannot use it through the gateway.
func TestLateConflictKeepsTheResponseItsOwners(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "event: response.created\ndata: "+
			`{"type":"response.created","sequence_number":0,"response":{"id":"resp_owned","object":"response","status":"in_progress","model":"gpt-test","output":[]}}`+"\n\n"+
			"event: response.output_text.delta\ndata: "+
			`{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"hi"}`+"\n\n"+
			"event: response.completed\ndata: "+
			`{"type":"response.completed","sequence_number":2,"response":{"id":"resp_owned","object":"response","status":"completed","model":"gpt-test","output":[],"usage":{"input_tokens":1,"output_tokens":1,"total_tokens":2}}}`+"\n\n")
	}))
	t.Cleanup(up.Close)
	owners, openGate := newGatedOwners(t) // the claim answers once the stream is over
	ctx := testCtx(t)
	if holder, err := owners.Store.Claim(ctx, "resp_owned", "team:search", time.Hour); err != nil || holder != "team:search" {
		t.Fatalf("claim: %q %v", holder, err)
	}
	tg := storedGateway(t, up.URL, owners)
	drain(t, storedClient(tg, keyBeta).Responses.NewStreaming(ctx, storedParams()))
	tg.record(t)
	wantMetric(t, tg, "tollgate_stored_claims_deferred_total", nil, 1)
	openGate()
	if err := tg.gw.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	if holder, err := owners.Store.Owner(ctx, "resp_owned"); err != nil || holder != "team:search" {
		t.Errorf("resp_owned owned by %q (%v), want team:search still", holder, err)
	}
	_, err := storedClient(tg, keyBeta).Responses.Get(ctx, "resp_owned", responses.ResponseGetParams{})
	var oe *openai.Error
	if !errors.As(err, &oe) || oe.StatusCode != http.StatusNotFound {
		t.Errorf("the other team's GET of resp_owned: %v, want a 404", err)
	}
}

// TestClaimLookupWaitHasItsOwnBound: a request naming a response whose
// claim is in flight waits for it, but no longer than the wait's own
// bound, nor than its context: then it goes on to the store (with a
// timeout of its own) rather than hang on a claim that does not end.
func TestClaimLookupWaitHasItsOwnBound(t *testing.T) {
	var f claimsInFlight
	c := &storedClaim{id: "resp_1", done: make(chan struct{})}
	f.add(c)
	returned := func(wait func()) bool {
		done := make(chan struct{})
		go func() { wait(); close(done) }()
		select {
		case <-done:
			return true
		case <-time.After(testWait):
			return false
		}
	}
	if !returned(func() { f.wait(context.Background(), "resp_1", time.Millisecond) }) {
		t.Error("the wait outlived its bound")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if !returned(func() { f.wait(ctx, "resp_1", time.Hour) }) {
		t.Error("the wait outlived its context")
	}
	if !returned(func() { f.wait(context.Background(), "resp_other", time.Hour) }) {
		t.Error("a wait for an id with no claim in flight waited")
	}
	held := make(chan struct{})
	go func() { f.wait(context.Background(), "resp_1", time.Hour); close(held) }()
	select {
	case <-held:
		t.Fatal("the wait returned while the claim was in flight")
	case <-time.After(20 * time.Millisecond): // ordering only: a late return would pass
	}
	close(c.done)
	f.remove(c)
	if !returned(func() { <-held }) {
		t.Error("the wait did not end with its claim")
	}
	if len(f.m) != 0 {
		t.Errorf("claims in flight after remove: %v", f.m)
	}
}
