package mockllm_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/conversations"
	ooption "github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/openai/openai-go/v3/shared"

	"github.com/tollgate-llm/tollgate/mockllm"
)

// textInput is a Responses input of one string.
func textInput(s string) responses.ResponseNewParamsInputUnion {
	return responses.ResponseNewParamsInputUnion{OfString: openai.String(s)}
}

// sdkError returns err as the SDK's API error, failing the test when it is
// not one with the given status.
func sdkError(t *testing.T, err error, status int) *openai.Error {
	t.Helper()
	var e *openai.Error
	if !errors.As(err, &e) {
		t.Fatalf("want an API error with status %d, got %v", status, err)
	}
	if e.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", e.StatusCode, status, e.RawJSON())
	}
	return e
}

// readBody reads a raw answer, checking its status.
func readBody(t *testing.T, resp *http.Response, status int) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d: %s", resp.Request.Method, resp.Request.URL.Path, resp.StatusCode, status, b)
	}
	return string(b)
}

// rawOf renders an SDK answer, or the error in its place, for a failure
// message.
func rawOf(v interface{ RawJSON() string }, err error) string {
	if err != nil {
		return err.Error()
	}
	return v.RawJSON()
}

// errorBody is the OpenAI error body the mock must send, built with
// encoding/json from its fields ("" is null).
func errorBody(msg, typ, param, code string) string {
	null := func(s string) *string {
		if s == "" {
			return nil
		}
		return &s
	}
	type e struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	b, _ := json.Marshal(struct {
		Error e `json:"error"`
	}{e{msg, typ, null(param), null(code)}})
	return string(b)
}

// A response, streamed or not, is retrievable by id as the object its
// creation answered: byte for byte the non-streamed body, or the terminal
// event's response.
func TestStoredResponseRetrievableViaSDK(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts, ooption.WithHeader("X-Mock-Output-Tokens", "5"))
	params := responses.ResponseNewParams{Model: "gpt-4.1", Input: textInput("What is the weather in Bergen?")}

	plain, err := client.Responses.New(waitCtx(t), params)
	if err != nil {
		t.Fatal(err)
	}
	got, err := client.Responses.Get(waitCtx(t), plain.ID, responses.ResponseGetParams{})
	if err != nil {
		t.Fatal(err)
	}
	if got.RawJSON() != plain.RawJSON() {
		t.Errorf("retrieved\n%s\nwant the created\n%s", got.RawJSON(), plain.RawJSON())
	}
	if got.OutputText() != words(" tok", 1, 5) || obj(t, got.RawJSON())["store"] != true {
		t.Errorf("retrieved %s", got.RawJSON())
	}

	streamed, _, _ := streamResponse(t, client, params)
	if streamed.ID == plain.ID {
		t.Fatalf("two responses share the id %s", plain.ID)
	}
	got, err = client.Responses.Get(waitCtx(t), streamed.ID, responses.ResponseGetParams{})
	if err != nil {
		t.Fatal(err)
	}
	if got.RawJSON() != streamed.RawJSON() || got.Status != responses.ResponseStatusCompleted {
		t.Errorf("retrieved\n%s\nwant the terminal event's\n%s", got.RawJSON(), streamed.RawJSON())
	}
}

// A string input is listed as one user message with an input_text part;
// an array input item by item in the order sent (order=asc), newest first
// by default, each with an id, in pages of limit.
func TestInputItemsListedAsSentViaSDK(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	const prompt = "What is the weather in Bergen?"
	r, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput(prompt)})
	if err != nil {
		t.Fatal(err)
	}
	page, err := client.Responses.InputItems.List(waitCtx(t), r.ID, responses.InputItemListParams{})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.HasMore {
		t.Fatalf("input items of a string: %s", page.RawJSON())
	}
	it := page.Data[0]
	msg := it.AsMessage()
	if it.Type != "message" || msg.Role != "user" || msg.Status != "completed" || !strings.HasPrefix(it.ID, "msg_") ||
		len(msg.Content) != 1 || msg.Content[0].Type != "input_text" || msg.Content[0].Text != prompt {
		t.Errorf("input item %s", it.RawJSON())
	}
	raw := obj(t, page.RawJSON())
	if raw["object"] != "list" || raw["first_id"] != it.ID || raw["last_id"] != it.ID || raw["has_more"] != false {
		t.Errorf("list %s", page.RawJSON())
	}

	// Three items: two messages in the easy form, one function call output
	// with its own id.
	input := responses.ResponseInputParam{
		responses.ResponseInputItemParamOfMessage("first", responses.EasyInputMessageRoleUser),
		responses.ResponseInputItemParamOfMessage("second", responses.EasyInputMessageRoleAssistant),
		{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
			ID: openai.String("fco_given"), CallID: openai.String("call_1"),
			Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String(`{"t":3}`)}}},
	}
	r, err = client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m",
		Input: responses.ResponseNewParamsInputUnion{OfInputItemList: input}})
	if err != nil {
		t.Fatal(err)
	}
	asc, err := client.Responses.InputItems.List(waitCtx(t), r.ID, responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc})
	if err != nil {
		t.Fatal(err)
	}
	if len(asc.Data) != 3 {
		t.Fatalf("want 3 items: %s", asc.RawJSON())
	}
	first, second, third := asc.Data[0], asc.Data[1], asc.Data[2]
	if first.Type != "message" || first.Role != "user" || first.AsMessage().Content[0].Text != "first" {
		t.Errorf("item 0 %s", first.RawJSON())
	}
	out := second.AsOutputMessage()
	if second.Type != "message" || second.Role != "assistant" || len(out.Content) != 1 ||
		out.Content[0].Type != "output_text" || out.Content[0].Text != "second" {
		t.Errorf("item 1 %s", second.RawJSON())
	}
	if third.Type != "function_call_output" || third.ID != "fco_given" || third.CallID != "call_1" {
		t.Errorf("item 2 %s", third.RawJSON())
	}
	ids := []string{first.ID, second.ID, third.ID}
	if first.ID == "" || second.ID == "" || first.ID == second.ID {
		t.Errorf("ids %v", ids)
	}

	desc, err := client.Responses.InputItems.List(waitCtx(t), r.ID, responses.InputItemListParams{})
	if err != nil {
		t.Fatal(err)
	}
	var descIDs []string
	for _, it := range desc.Data {
		descIDs = append(descIDs, it.ID)
	}
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	if !slices.Equal(descIDs, newest) {
		t.Errorf("default order %v, want newest first of %v", descIDs, ids)
	}

	// Pages of two, asc: the SDK follows has_more and the last id.
	var paged []string
	iter := client.Responses.InputItems.ListAutoPaging(waitCtx(t), r.ID,
		responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc, Limit: openai.Int(2)})
	for iter.Next() {
		paged = append(paged, iter.Current().ID)
	}
	if err := iter.Err(); err != nil || !slices.Equal(paged, ids) {
		t.Errorf("paged %v (%v), want %v", paged, err, ids)
	}
	p1, err := client.Responses.InputItems.List(waitCtx(t), r.ID,
		responses.InputItemListParams{Order: responses.InputItemListParamsOrderAsc, Limit: openai.Int(2)})
	if err != nil || !p1.HasMore || len(p1.Data) != 2 {
		t.Errorf("first page of 2: %s", rawOf(p1, err))
	}
}

// A deleted response answers the delete body once and is gone: retrieve,
// input items and a second delete are 404 with the API's message.
func TestDeletedResponseIsGone(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	r, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi")})
	if err != nil {
		t.Fatal(err)
	}
	raw := readBody(t, do(t, waitCtx(t), ts, http.MethodDelete, "/v1/responses/"+r.ID, ""), http.StatusOK)
	if want := `{"id":"` + r.ID + `","object":"response","deleted":true}`; raw != want {
		t.Errorf("delete body %s, want %s", raw, want)
	}
	_, err = client.Responses.Get(waitCtx(t), r.ID, responses.ResponseGetParams{})
	e := sdkError(t, err, http.StatusNotFound)
	if want := "Response with id '" + r.ID + "' not found."; e.Message != want || e.Type != "invalid_request_error" {
		t.Errorf("get after delete: %s", e.RawJSON())
	}
	_, err = client.Responses.InputItems.List(waitCtx(t), r.ID, responses.InputItemListParams{})
	sdkError(t, err, http.StatusNotFound)
	sdkError(t, client.Responses.Delete(waitCtx(t), r.ID), http.StatusNotFound)

	// The SDK's own delete, on another response.
	r2, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi")})
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Responses.Delete(waitCtx(t), r2.ID); err != nil {
		t.Fatal(err)
	}
	_, err = client.Responses.Get(waitCtx(t), r2.ID, responses.ResponseGetParams{})
	sdkError(t, err, http.StatusNotFound)
}

// previous_response_id must name a stored response: a known one is
// accepted and echoed, an unknown one is a 400 previous_response_not_found,
// and naming a conversation as well is a 400 mutually_exclusive_parameters.
func TestPreviousResponseMustExist(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	first, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi")})
	if err != nil {
		t.Fatal(err)
	}
	next, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("more"),
		PreviousResponseID: openai.String(first.ID)})
	if err != nil {
		t.Fatal(err)
	}
	if next.PreviousResponseID != first.ID || next.ID == first.ID || next.Status != responses.ResponseStatusCompleted {
		t.Errorf("continued response %s", next.RawJSON())
	}

	const unknown = "resp_unknown"
	_, err = client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("more"),
		PreviousResponseID: openai.String(unknown)})
	e := sdkError(t, err, http.StatusBadRequest)
	if e.Code != "previous_response_not_found" || e.Param != "previous_response_id" ||
		e.Message != "Previous response with id '"+unknown+"' not found." {
		t.Errorf("unknown previous response: %s", e.RawJSON())
	}

	conv, err := client.Conversations.New(waitCtx(t), conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"model":"m","input":"hi","previous_response_id":%q,"conversation":%q}`, first.ID, conv.ID)
	raw := readBody(t, post(t, ts, "/v1/responses", body), http.StatusBadRequest)
	want := errorBody("Mutually exclusive parameters. Ensure you are only providing one of: 'previous_response_id' or 'conversation'.",
		"invalid_request_error", "", "mutually_exclusive_parameters")
	if raw != want {
		t.Errorf("both: %s, want %s", raw, want)
	}
}

// A background stream can be streamed again with GetStreaming: the same
// events (types, sequence numbers, JSON) as the original, from
// starting_after on, on the original's schedule.
func TestBackgroundStreamReplaysViaSDK(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	const ttft = 40 * time.Millisecond
	client := openAIClient(ts, ooption.WithHeader("X-Mock-Output-Tokens", "6"),
		ooption.WithHeader("X-Mock-Reasoning-Tokens", "2"), ooption.WithHeader("X-Mock-TTFT-Ms", "40"))
	params := responses.ResponseNewParams{Model: "gpt-4.1", Input: textInput("hi"), Background: openai.Bool(true)}
	stream := client.Responses.NewStreaming(waitCtx(t), params)
	var orig []responses.ResponseStreamEventUnion
	for stream.Next() {
		orig = append(orig, stream.Current())
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	stream.Close()
	if len(orig) < 4 || orig[0].Type != "response.created" || orig[len(orig)-1].Type != "response.completed" {
		t.Fatalf("original stream %d events", len(orig))
	}
	created := orig[0].Response
	final := orig[len(orig)-1].Response
	if created.Status != responses.ResponseStatusQueued || !created.Background || !final.Background {
		t.Errorf("background stream: created %s", created.RawJSON())
	}
	id := final.ID

	replay := func(after int64) ([]responses.ResponseStreamEventUnion, time.Duration) {
		t.Helper()
		var q responses.ResponseGetParams
		if after >= 0 {
			q.StartingAfter = openai.Int(after)
		}
		t0 := time.Now()
		s := client.Responses.GetStreaming(waitCtx(t), id, q)
		defer s.Close()
		var evs []responses.ResponseStreamEventUnion
		for s.Next() {
			evs = append(evs, s.Current())
		}
		if err := s.Err(); err != nil {
			t.Fatalf("replay after %d: %v", after, err)
		}
		return evs, time.Since(t0)
	}
	for _, after := range []int64{-1, 0, 5, int64(len(orig)) - 2} {
		evs, took := replay(after)
		want := orig[after+1:]
		if len(evs) != len(want) {
			t.Errorf("after %d: %d events, want %d", after, len(evs), len(want))
			continue
		}
		for i := range evs {
			if evs[i].Type != want[i].Type || evs[i].SequenceNumber != want[i].SequenceNumber || evs[i].RawJSON() != want[i].RawJSON() {
				t.Errorf("after %d, event %d: %s\nwant %s", after, i, evs[i].RawJSON(), want[i].RawJSON())
			}
		}
		if got := evs[len(evs)-1].Response; got.OutputText() != final.OutputText() || got.OutputText() != words(" tok", 1, 6) {
			t.Errorf("after %d: final text %q, want %q", after, got.OutputText(), final.OutputText())
		}
		if took < ttft {
			t.Errorf("after %d: replayed in %v, before the TTFT of %v", after, took, ttft)
		}
	}
	// GetStreaming sends stream:true as a JSON body on the GET; the query
	// form works as well.
	if rec := lastBody(t, m, "/v1/responses/"+id); !strings.Contains(string(rec), `"stream":true`) {
		t.Errorf("GetStreaming sent %s", rec)
	}
	resp := do(t, waitCtx(t), ts, http.MethodGet, "/v1/responses/"+id+"?stream=true&starting_after=3", "")
	evs := readAllEvents(t, resp)
	if resp.Header.Get("Content-Type") != "text/event-stream" || len(evs) != len(orig)-4 || evs[0].data != orig[4].RawJSON() {
		t.Errorf("query replay: %d events, want %d", len(evs), len(orig)-4)
	}

	// Retrieved without stream, it is the finished object.
	got, err := client.Responses.Get(waitCtx(t), id, responses.ResponseGetParams{})
	if err != nil || got.RawJSON() != final.RawJSON() {
		t.Errorf("retrieved %s\nwant %s", rawOf(got, err), final.RawJSON())
	}
}

// Only a background stream streams again: a synchronous stream and a
// background response created without stream answer 404 as unknown.
func TestReplayNeedsBackgroundStream(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	synced, _, _ := streamResponse(t, client, responses.ResponseNewParams{Model: "m", Input: textInput("hi")})
	bg, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi"),
		Background: openai.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{synced.ID, bg.ID} {
		s := client.Responses.GetStreaming(waitCtx(t), id, responses.ResponseGetParams{})
		for s.Next() {
			t.Errorf("%s: event %s", id, s.Current().Type)
		}
		e := sdkError(t, s.Err(), http.StatusNotFound)
		if e.Message != "Response with id '"+id+"' not found." {
			t.Errorf("%s: %s", id, e.RawJSON())
		}
		s.Close()
	}
}

// A background response created without stream answers at once, queued
// and without usage; retrieved, it is completed with usage.
func TestBackgroundIsQueuedThenCompleted(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	// A TTFT longer than the test may wait: the queued answer must not
	// wait for it (if it did, it would take the TTFT at least, or fail
	// with the context), however busy the machine.
	const ttft = time.Hour
	client := openAIClient(ts, ooption.WithHeader("X-Mock-TTFT-Ms", strconv.FormatInt(ttft.Milliseconds(), 10)),
		ooption.WithHeader("X-Mock-Output-Tokens", "3"))
	t0 := time.Now()
	q, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi"),
		Background: openai.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took >= ttft {
		t.Errorf("the queued answer took %v, the TTFT", took)
	}
	raw := obj(t, q.RawJSON())
	if q.Status != responses.ResponseStatusQueued || !q.Background || raw["usage"] != nil || len(q.Output) != 0 {
		t.Errorf("queued answer %s", q.RawJSON())
	}
	got, err := client.Responses.Get(waitCtx(t), q.ID, responses.ResponseGetParams{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != responses.ResponseStatusCompleted || !got.Background || got.CreatedAt != q.CreatedAt ||
		got.Usage.OutputTokens != 3 || got.OutputText() != words(" tok", 1, 3) {
		t.Errorf("retrieved %s", got.RawJSON())
	}
	// Background needs store.
	resp := post(t, ts, "/v1/responses", `{"model":"m","input":"hi","background":true,"store":false}`)
	if b := obj(t, readBody(t, resp, http.StatusBadRequest)); path(b, "error", "param") != "background" {
		t.Errorf("background without store: %v", b)
	}
}

// Cancel ends a background response cancelled, the same object on a second
// cancel and on retrieve; a synchronous one cannot be cancelled (400) and
// an unknown one is 404.
func TestCancelOnlyBackground(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	bg, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi"),
		Background: openai.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := client.Responses.Cancel(waitCtx(t), bg.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c1.Status != responses.ResponseStatusCancelled || c1.ID != bg.ID || !c1.Background {
		t.Errorf("cancelled %s", c1.RawJSON())
	}
	c2, err := client.Responses.Cancel(waitCtx(t), bg.ID)
	if err != nil || c2.RawJSON() != c1.RawJSON() {
		t.Errorf("second cancel %s, want %s", rawOf(c2, err), c1.RawJSON())
	}
	got, err := client.Responses.Get(waitCtx(t), bg.ID, responses.ResponseGetParams{})
	if err != nil || got.RawJSON() != c1.RawJSON() {
		t.Errorf("retrieved after cancel %s", rawOf(got, err))
	}

	synced, err := client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("hi")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.Responses.Cancel(waitCtx(t), synced.ID)
	if e := sdkError(t, err, http.StatusBadRequest); e.Message != "Cannot cancel a synchronous response." ||
		e.Type != "invalid_request_error" {
		t.Errorf("cancel of a synchronous response: %s", e.RawJSON())
	}
	if got, err := client.Responses.Get(waitCtx(t), synced.ID, responses.ResponseGetParams{}); err != nil ||
		got.Status != responses.ResponseStatusCompleted {
		t.Errorf("synchronous response after a refused cancel: %s", rawOf(got, err))
	}
	_, err = client.Responses.Cancel(waitCtx(t), "resp_nope")
	sdkError(t, err, http.StatusNotFound)
}

// "store": false answers as usual, echoes store false, and keeps nothing:
// no retrieve, no input items, no continuation.
func TestStoreFalseIsNotRetrievable(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	for _, stream := range []bool{false, true} {
		params := responses.ResponseNewParams{Model: "m", Input: textInput("hi"), Store: openai.Bool(false)}
		var r *responses.Response
		if stream {
			r, _, _ = streamResponse(t, client, params)
		} else {
			var err error
			if r, err = client.Responses.New(waitCtx(t), params); err != nil {
				t.Fatal(err)
			}
		}
		if obj(t, r.RawJSON())["store"] != false || r.Status != responses.ResponseStatusCompleted {
			t.Errorf("stream %v: %s", stream, r.RawJSON())
		}
		_, err := client.Responses.Get(waitCtx(t), r.ID, responses.ResponseGetParams{})
		sdkError(t, err, http.StatusNotFound)
		_, err = client.Responses.InputItems.List(waitCtx(t), r.ID, responses.InputItemListParams{})
		sdkError(t, err, http.StatusNotFound)
		_, err = client.Responses.New(waitCtx(t), responses.ResponseNewParams{Model: "m", Input: textInput("more"),
			PreviousResponseID: openai.String(r.ID)})
		if e := sdkError(t, err, http.StatusBadRequest); e.Code != "previous_response_not_found" {
			t.Errorf("continuing an unstored response: %s", e.RawJSON())
		}
	}
}

// A stream that fails (error-event) is stored failed, as its
// response.failed event carried it.
func TestFailedStreamStoredFailed(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	resp := post(t, ts, "/v1/responses", `{"model":"m","input":"hi","stream":true}`, "X-Mock-Fault", "error-event=2")
	evs := readAllEvents(t, resp)
	last := evs[len(evs)-1]
	if last.name != "response.failed" {
		t.Fatalf("last event %s", last.name)
	}
	failed := obj(t, last.data)["response"].(map[string]any)
	id := failed["id"].(string)
	got := obj(t, readBody(t, do(t, waitCtx(t), ts, http.MethodGet, "/v1/responses/"+id, ""), http.StatusOK))
	if got["status"] != "failed" || got["usage"] != nil || path(got, "error", "code") != "server_error" {
		t.Errorf("stored failed response %v", got)
	}
}

// The Conversations API through openai-go: create with items and metadata,
// retrieve, update, add, list, get and delete items, delete.
func TestConversationsViaSDK(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	ctx := waitCtx(t)
	before := time.Now().Unix()
	conv, err := client.Conversations.New(ctx, conversations.ConversationNewParams{
		Items: []responses.ResponseInputItemUnionParam{
			responses.ResponseInputItemParamOfMessage("hello", responses.EasyInputMessageRoleUser)},
		Metadata: shared.Metadata{"topic": "weather"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(conv.ID, "conv_") || conv.Object != "conversation" || conv.CreatedAt < before ||
		!metaIs(conv.Metadata, "topic", "weather") {
		t.Errorf("created %s", conv.RawJSON())
	}
	got, err := client.Conversations.Get(ctx, conv.ID)
	if err != nil || got.RawJSON() != conv.RawJSON() {
		t.Errorf("retrieved %s, want %s", rawOf(got, err), conv.RawJSON())
	}
	up, err := client.Conversations.Update(ctx, conv.ID, conversations.ConversationUpdateParams{
		Metadata: shared.Metadata{"topic": "rain", "city": "Bergen"}})
	if err != nil || up.ID != conv.ID || up.CreatedAt != conv.CreatedAt || !metaIs(up.Metadata, "topic", "rain") ||
		!metaIs(up.Metadata, "city", "Bergen") {
		t.Errorf("updated %s", rawOf(up, err))
	}

	added, err := client.Conversations.Items.New(ctx, conv.ID, conversations.ItemNewParams{
		Items: []responses.ResponseInputItemUnionParam{
			responses.ResponseInputItemParamOfMessage("one", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfMessage("two", responses.EasyInputMessageRoleAssistant),
		}})
	if err != nil {
		t.Fatal(err)
	}
	if len(added.Data) != 2 || added.FirstID != added.Data[0].ID || added.LastID != added.Data[1].ID || added.HasMore ||
		added.Data[0].AsMessage().Content[0].Text != "one" || added.Data[1].Role != "assistant" {
		t.Errorf("added %s", added.RawJSON())
	}
	list, err := client.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{Order: conversations.ItemListParamsOrderAsc})
	if err != nil {
		t.Fatal(err)
	}
	texts := itemTexts(list.Data)
	if !slices.Equal(texts, []string{"hello", "one", "two"}) || list.LastID != added.Data[1].ID {
		t.Errorf("items %v, last %s", texts, list.LastID)
	}
	item, err := client.Conversations.Items.Get(ctx, conv.ID, added.Data[0].ID, conversations.ItemGetParams{})
	if err != nil || item.RawJSON() != added.Data[0].RawJSON() {
		t.Errorf("item %s, want %s", rawOf(item, err), added.Data[0].RawJSON())
	}
	after, err := client.Conversations.Items.Delete(ctx, conv.ID, added.Data[0].ID)
	if err != nil || after.ID != conv.ID || after.Object != "conversation" {
		t.Errorf("item delete answered %s", rawOf(after, err))
	}
	_, err = client.Conversations.Items.Get(ctx, conv.ID, added.Data[0].ID, conversations.ItemGetParams{})
	sdkError(t, err, http.StatusNotFound)
	list, err = client.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{})
	if err != nil || !slices.Equal(itemTexts(list.Data), []string{"two", "hello"}) {
		t.Errorf("items after the delete, newest first: %s", rawOf(list, err))
	}

	del, err := client.Conversations.Delete(ctx, conv.ID)
	if err != nil || del.ID != conv.ID || !del.Deleted || del.Object != "conversation.deleted" {
		t.Errorf("deleted %s", rawOf(del, err))
	}
	_, err = client.Conversations.Get(ctx, conv.ID)
	if e := sdkError(t, err, http.StatusNotFound); e.Message != "Conversation with id '"+conv.ID+"' not found." {
		t.Errorf("after delete: %s", e.RawJSON())
	}
	_, err = client.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{})
	sdkError(t, err, http.StatusNotFound)
}

// metaIs reports whether decoded metadata holds key: value.
func metaIs(meta any, key, value string) bool {
	m, ok := meta.(map[string]any)
	return ok && m[key] == value
}

// itemTexts is the first text part of each message item.
func itemTexts(items []conversations.ConversationItemUnion) []string {
	var out []string
	for _, it := range items {
		var v struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
		_ = json.Unmarshal([]byte(it.RawJSON()), &v)
		if len(v.Content) > 0 {
			out = append(out, v.Content[0].Text)
		}
	}
	return out
}

// A response created in a conversation appends its input and output items
// to it, streamed or not, by id string or object; an unknown conversation
// is a 404 naming the parameter.
func TestResponseAppendsToConversation(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts, ooption.WithHeader("X-Mock-Output-Tokens", "2"))
	ctx := waitCtx(t)
	conv, err := client.Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := client.Responses.New(ctx, responses.ResponseNewParams{Model: "m", Input: textInput("q1"),
		Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)}})
	if err != nil {
		t.Fatal(err)
	}
	if r.Conversation.ID != conv.ID {
		t.Errorf("response conversation %q", r.Conversation.ID)
	}
	streamed, _, _ := streamResponse(t, client, responses.ResponseNewParams{Model: "m", Input: textInput("q2"),
		Conversation: responses.ResponseNewParamsConversationUnion{
			OfConversationObject: &responses.ResponseConversationParam{ID: conv.ID}}})
	list, err := client.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{Order: conversations.ItemListParamsOrderAsc})
	if err != nil {
		t.Fatal(err)
	}
	answer := words(" tok", 1, 2)
	if texts := itemTexts(list.Data); !slices.Equal(texts, []string{"q1", answer, "q2", answer}) {
		t.Fatalf("conversation items %v", texts)
	}
	if list.Data[1].ID != r.Output[0].ID || list.Data[3].ID != streamed.Output[0].ID || list.Data[1].Role != "assistant" {
		t.Errorf("output items %s / %s", list.Data[1].ID, list.Data[3].ID)
	}
	inputs, err := client.Responses.InputItems.List(ctx, r.ID, responses.InputItemListParams{})
	if err != nil || len(inputs.Data) != 1 || inputs.Data[0].ID != list.Data[0].ID {
		t.Errorf("the response's input items %s, want the conversation's %s", rawOf(inputs, err), list.Data[0].ID)
	}

	const unknown = "conv_unknown"
	_, err = client.Responses.New(ctx, responses.ResponseNewParams{Model: "m", Input: textInput("q"),
		Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(unknown)}})
	if e := sdkError(t, err, http.StatusNotFound); e.Param != "conversation" ||
		e.Message != "Conversation with id '"+unknown+"' not found." {
		t.Errorf("unknown conversation: %s", e.RawJSON())
	}
}

// The exact JSON of what the SDK hides: delete bodies, 404 bodies, the
// list shape of an empty page, the wrong-method 405 and the paths that are
// still unknown.
func TestStoredRoutesRawWire(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	get := func(p string, status int) string {
		t.Helper()
		return readBody(t, do(t, waitCtx(t), ts, http.MethodGet, p, ""), status)
	}
	if got, want := get("/v1/responses/resp_x", 404), errorBody("Response with id 'resp_x' not found.",
		"invalid_request_error", "", ""); got != want {
		t.Errorf("unknown response: %s, want %s", got, want)
	}
	if got, want := get("/v1/conversations/conv_x", 404), errorBody("Conversation with id 'conv_x' not found.",
		"invalid_request_error", "", ""); got != want {
		t.Errorf("unknown conversation: %s, want %s", got, want)
	}

	created := obj(t, readBody(t, post(t, ts, "/v1/conversations", ""), http.StatusOK))
	id, _ := created["id"].(string)
	if len(created) != 4 || created["object"] != "conversation" || num(created["created_at"]) <= 0 ||
		fmt.Sprint(created["metadata"]) != "map[]" {
		t.Errorf("created from an empty body: %v", created)
	}
	if got := get("/v1/conversations/"+id+"/items", 200); got != `{"object":"list","data":[],"first_id":null,"last_id":null,"has_more":false}` {
		t.Errorf("empty items: %s", got)
	}
	items := obj(t, readBody(t, post(t, ts, "/v1/conversations/"+id+"/items", `{"items":[{"role":"user","content":"hi"}]}`), 200))
	itemID, _ := path(items, "data", "0", "id").(string)
	want := `{"id":"` + itemID + `","type":"message","content":[{"type":"input_text","text":"hi"}],"role":"user","status":"completed"}`
	if got := get("/v1/conversations/"+id+"/items/"+itemID, 200); got != want {
		t.Errorf("item %s, want %s", got, want)
	}
	if got, want := get("/v1/conversations/"+id+"/items/msg_x", 404), errorBody("Item with id 'msg_x' not found.",
		"invalid_request_error", "", ""); got != want {
		t.Errorf("unknown item: %s, want %s", got, want)
	}
	if got, want := readBody(t, do(t, waitCtx(t), ts, http.MethodDelete, "/v1/conversations/"+id, ""), 200),
		`{"id":"`+id+`","object":"conversation.deleted","deleted":true}`; got != want {
		t.Errorf("conversation delete %s, want %s", got, want)
	}

	// Wrong methods name the allowed ones.
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPost, "/v1/responses/resp_x", "GET, DELETE"},
		{http.MethodGet, "/v1/responses/resp_x/cancel", "POST"},
		{http.MethodDelete, "/v1/responses/resp_x/input_items", "GET"},
		{http.MethodGet, "/v1/conversations", "POST"},
		{http.MethodPut, "/v1/conversations/conv_x", "GET, POST, DELETE"},
		{http.MethodDelete, "/v1/conversations/conv_x/items", "GET, POST"},
		{http.MethodPost, "/v1/conversations/conv_x/items/msg_x", "GET, DELETE"},
	} {
		resp := do(t, waitCtx(t), ts, c.method, c.path, "")
		readBody(t, resp, http.StatusMethodNotAllowed)
		if resp.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, resp.Header.Get("Allow"), c.allow)
		}
	}
	// Paths outside the family stay unknown routes.
	for _, p := range []string{"/v1/responses/resp_x/other", "/v1/responses//cancel", "/v1/conversations/conv_x/items/a/b"} {
		if got, want := get(p, 404), errorBody("Invalid URL (GET "+p+")", "invalid_request_error", "", ""); got != want {
			t.Errorf("%s: %s, want %s", p, got, want)
		}
	}
	if got := readBody(t, post(t, ts, "/v1/responses/compact", `{}`), 404); !strings.Contains(got, "Invalid URL") {
		t.Errorf("compact: %s", got)
	}

	// List parameters are checked as the API checks them.
	for _, c := range []struct{ query, param, code string }{
		{"limit=0", "limit", "integer_below_min_value"},
		{"limit=101", "limit", "integer_above_max_value"},
		{"limit=x", "limit", "invalid_type"},
		{"order=up", "order", "invalid_value"},
	} {
		conv := obj(t, readBody(t, post(t, ts, "/v1/conversations", `{}`), 200))
		b := obj(t, get("/v1/conversations/"+conv["id"].(string)+"/items?"+c.query, 400))
		if path(b, "error", "param") != c.param || path(b, "error", "code") != c.code {
			t.Errorf("%s: %v", c.query, b)
		}
	}
}

// The stored routes are counted like the other non-generation routes: an
// answer is Completed, a 404 or 405 a BadRequest, and no request is left
// uncounted.
func TestStoredRoutesCounted(t *testing.T) {
	m, ts := start(t, mockllm.Options{})
	id, _ := obj(t, readBody(t, post(t, ts, "/v1/responses", `{"model":"m","input":"hi"}`), 200))["id"].(string)
	base := settled(t, m)
	readBody(t, do(t, waitCtx(t), ts, http.MethodGet, "/v1/responses/"+id, ""), 200)
	readBody(t, do(t, waitCtx(t), ts, http.MethodGet, "/v1/responses/"+id+"/input_items", ""), 200)
	readBody(t, do(t, waitCtx(t), ts, http.MethodGet, "/v1/responses/resp_nope", ""), 404)
	readBody(t, do(t, waitCtx(t), ts, http.MethodPut, "/v1/responses/"+id, ""), 405)
	readBody(t, post(t, ts, "/v1/conversations", ""), 200)
	st := settled(t, m)
	if st.Requests-base.Requests != 5 || st.Completed-base.Completed != 3 || st.BadRequests-base.BadRequests != 2 ||
		st.Faults != 0 || st.Injected != 0 {
		t.Errorf("counters went from %+v to %+v", base, st)
	}
}

// Concurrent creates, reads and deletes of responses and conversations are
// safe (run with -race) and lose nothing.
func TestStoredConcurrent(t *testing.T) {
	_, ts := start(t, mockllm.Options{})
	client := openAIClient(ts)
	ctx := waitCtx(t)
	conv, err := client.Conversations.New(ctx, conversations.ConversationNewParams{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			text := "q" + strconv.Itoa(i)
			r, err := client.Responses.New(ctx, responses.ResponseNewParams{Model: "m", Input: textInput(text),
				Conversation: responses.ResponseNewParamsConversationUnion{OfString: openai.String(conv.ID)}})
			if err == nil {
				_, err = client.Responses.Get(ctx, r.ID, responses.ResponseGetParams{})
			}
			if err == nil {
				_, err = client.Conversations.Items.List(ctx, conv.ID, conversations.ItemListParams{})
			}
			if err == nil && i%2 == 0 {
				err = client.Responses.Delete(ctx, r.ID)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	var count int
	iter := client.Conversations.Items.ListAutoPaging(ctx, conv.ID, conversations.ItemListParams{Limit: openai.Int(5)})
	for iter.Next() {
		count++
	}
	if err := iter.Err(); err != nil || count != 2*n {
		t.Errorf("%d conversation items (%v), want %d", count, err, 2*n)
	}
}
