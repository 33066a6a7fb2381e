package mockllm_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/tollgate-llm/tollgate/llm"
	"github.com/tollgate-llm/tollgate/mockllm"
	"github.com/tollgate-llm/tollgate/sseparse"
)

// socketEvent is what a test reads of a server event.
type socketEvent struct {
	Type     string `json:"type"`
	Seq      int64  `json:"sequence_number"`
	Status   int    `json:"status"`
	Response struct {
		ID string `json:"id"`
	} `json:"response"`
	Error struct {
		Type string `json:"type"`
		Code string `json:"code"`
	} `json:"error"`
	Headers map[string]string `json:"headers"`
}

// socketTurn sends one raw client event on conn and reads server events
// until a terminal event or an error event, returning them raw.
func socketTurn(t *testing.T, ctx context.Context, conn *openai.BetaResponseConnection, event string) []json.RawMessage {
	t.Helper()
	if err := conn.SendRaw(ctx, json.RawMessage(event)); err != nil {
		t.Fatalf("send: %v", err)
	}
	var got []json.RawMessage
	for {
		raw, err := conn.RecvRaw(ctx)
		if err != nil {
			t.Fatalf("receive after %d events: %v", len(got), err)
		}
		got = append(got, raw)
		var ev socketEvent
		if err := json.Unmarshal(raw, &ev); err != nil {
			t.Fatalf("event %q is not JSON: %v", raw, err)
		}
		switch ev.Type {
		case "response.completed", "response.failed", "response.incomplete", "error":
			return got
		}
	}
}

// connectMock opens the official SDK's Responses WebSocket on ts.
func connectMock(t *testing.T, ctx context.Context, client openai.Client) *openai.BetaResponseConnection {
	t.Helper()
	conn, err := client.Beta.Responses.Connect(ctx, openai.BetaResponseConnectionOptions{})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestSocketTurnsAreTheSSEStreamsEvents: over the WebSocket the official
// SDK gets, turn after turn on one socket, the events the SSE stream
// carries (their data, one per message, in order, sequence numbers from 0),
// with the usage of the plan on the terminal event; an error answer is an
// error event with its status and retry headers, after which the socket
// still serves a turn.
func TestSocketTurnsAreTheSSEStreamsEvents(t *testing.T) {
	m, ts := start(t, mockllm.Options{OutputTokens: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := connectMock(t, ctx, openAIClient(ts))
	create := `{"type":"response.create","model":"gpt-4.1","input":"hi","store":false}`

	for turn := range 2 {
		events := socketTurn(t, ctx, conn, create)
		var tap sseparse.Tap
		tap.Reset(llm.DialectResponses)
		for i, raw := range events {
			var ev socketEvent
			_ = json.Unmarshal(raw, &ev)
			if ev.Seq != int64(i) {
				t.Errorf("turn %d: event %d (%s) has sequence_number %d", turn, i, ev.Type, ev.Seq)
			}
			tap.Observe(&sseparse.Event{Data: raw}, time.Now())
		}
		var first socketEvent
		_ = json.Unmarshal(events[0], &first)
		if first.Type != "response.created" || !strings.HasPrefix(first.Response.ID, "resp_mock") {
			t.Errorf("turn %d opens with %s %q, want response.created of a mock response", turn, first.Type, first.Response.ID)
		}
		u, ok := tap.Usage()
		if !ok || u.Output != 5 || tap.TokenEvents() != 5 || !tap.TerminalSeen() {
			t.Errorf("turn %d: usage %+v (%v), %d token events, terminal %v; want 5 output tokens in 5 events",
				turn, u, ok, tap.TokenEvents(), tap.TerminalSeen())
		}
	}

	if err := m.Inject("status=429;retry-after=7", 1); err != nil {
		t.Fatal(err)
	}
	events := socketTurn(t, ctx, conn, create)
	var ev socketEvent
	_ = json.Unmarshal(events[len(events)-1], &ev)
	if len(events) != 1 || ev.Type != "error" || ev.Status != 429 || ev.Error.Type == "" || ev.Headers["retry-after"] != "7" {
		t.Errorf("refused turn: %d events, last %s", len(events), events[len(events)-1])
	}
	if events := socketTurn(t, ctx, conn, create); !strings.Contains(string(events[len(events)-1]), `"response.completed"`) {
		t.Errorf("the turn after an error event ended %s", events[len(events)-1])
	}

	if events := socketTurn(t, ctx, conn, `{"type":"response.steer","previous_response_id":"resp_x","input":"go on"}`); !strings.Contains(string(events[0]), `"unknown_event"`) {
		t.Errorf("an event the mock does not answer got %s", events[0])
	}
	if got := m.Stats().Requests; got != 4 {
		t.Errorf("%d requests counted, want the 4 turns", got)
	}
}

// TestSocketWarmUpGeneratesNothing: a response.create with "generate":
// false (Codex's prewarm) is answered with a response that has no output
// and reports no output tokens, whose id a later turn chains from.
func TestSocketWarmUpGeneratesNothing(t *testing.T) {
	_, ts := start(t, mockllm.Options{OutputTokens: 5})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn := connectMock(t, ctx, openAIClient(ts))
	events := socketTurn(t, ctx, conn, `{"type":"response.create","model":"gpt-4.1","input":"hi","generate":false}`)
	var tap sseparse.Tap
	tap.Reset(llm.DialectResponses)
	for _, raw := range events {
		tap.Observe(&sseparse.Event{Data: raw}, time.Now())
	}
	u, _ := tap.Usage()
	if tap.TokenEvents() != 0 || u.Output != 0 || !u.HasInput || !tap.TerminalSeen() {
		t.Errorf("warm-up: %d token events, usage %+v, terminal %v; want none, no output, input counted",
			tap.TokenEvents(), u, tap.TerminalSeen())
	}
	var first socketEvent
	_ = json.Unmarshal(events[0], &first)
	chained := socketTurn(t, ctx, conn, `{"type":"response.create","model":"gpt-4.1","input":"go","previous_response_id":"`+
		first.Response.ID+`"}`)
	if !strings.Contains(string(chained[len(chained)-1]), `"response.completed"`) {
		t.Errorf("the turn chained from the warm-up ended %s", chained[len(chained)-1])
	}
}
