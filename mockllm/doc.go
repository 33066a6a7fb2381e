// Package mockllm is a fake OpenAI and Anthropic upstream. It speaks their
// wire formats the way the real APIs do (the chunk, event, usage and error
// shapes of Chat Completions, Messages and the Responses API, streamed or
// not), with a set
// time to first token, inter-token latency, token counts and faults, so that
// tests, `gateway demo` and benchmarks have something predictable to proxy.
//
// # Routes
//
//	POST /v1/chat/completions     OpenAI Chat Completions, streamed or not
//	POST /v1/messages             Anthropic Messages, streamed or not
//	POST /v1/responses            OpenAI Responses API, streamed or not
//	POST /v1/messages/count_tokens {"input_tokens": N}
//	POST /v1/responses/input_tokens {"object": "response.input_tokens", "input_tokens": N}
//	GET  /v1/models               OpenAI list shape
//	POST /v1/embeddings           a small deterministic embedding list with usage
//
// and the stored state of the Responses and Conversations APIs (see Stored
// state):
//
//	GET    /v1/responses/{id}                   the response; ?stream=true streams a background one again
//	DELETE /v1/responses/{id}                   {"id","object":"response","deleted":true}
//	POST   /v1/responses/{id}/cancel            a background response, status "cancelled"
//	GET    /v1/responses/{id}/input_items       list of its input items
//	POST   /v1/conversations                    {"id","object":"conversation","created_at","metadata"}
//	GET, POST, DELETE /v1/conversations/{id}    retrieve, update metadata, delete
//	GET, POST /v1/conversations/{id}/items      list, add (answers the added items)
//	GET, DELETE /v1/conversations/{id}/items/{item_id}  the item; delete answers the conversation
//
// Anything else is a 404 in the OpenAI error shape. A wrong method is a 405,
// bad JSON, a missing model, a missing or non-positive max_tokens on Messages
// and a bad X-Mock-* header are a 400, each in the route's dialect. With
// Options.RequireKey set, a request whose Authorization Bearer token or
// x-api-key differs gets a 401 in the dialect (the key is never echoed).
//
// # Schedule
//
// Let t0 be the moment the mock starts its response: the request's arrival,
// plus the time it waited for a slot when Options.MaxConcurrent is set, plus
// the stall=<ms> fault if any. At t0 the response headers are written with the
// events that carry no token:
//
//   - OpenAI: the role-only chunk, delta {"role":"assistant","content":""}.
//   - Anthropic: message_start (usage with the input counts and
//     output_tokens 1), content_block_start of the first block, and a ping.
//   - Responses: response.created and response.in_progress. A reasoning
//     item's and the message's added events go out with their first delta;
//     a function call's output_item.added, which names the tool, is its
//     first token event. The stream ends with response.completed (or
//     response.incomplete, reason max_output_tokens, when max_output_tokens
//     cut it), the only event with usage, and no [DONE]; the error-event
//     fault sends the nested error event then response.failed, as the
//     real API does.
//
// Token-bearing event k (0-based, counted across reasoning and answer) is
// written at
//
//	t0 + TTFT + k·ITL + jitter_k
//
// where jitter_k is drawn uniformly from [-Jitter/2, +Jitter/2] by a PRNG
// seeded from Options.Seed and the request's sequence number (the first
// request is 1), so a given Seed and request order give the same offsets.
// Deadlines are absolute: each wait is a timer to the deadline, never an
// accumulated sleep, so lateness does not drift into later events. A deadline
// before t0 is clamped to t0, and a deadline already past is written at once.
// Each event is flushed as soon as it is written. Events that carry no token
// and are due at the same moment as the token event before them (the
// signature_delta and the block stop/start after the last thinking token; the
// finish chunk, usage chunk and [DONE]; the last content_block_stop,
// message_delta and message_stop) go out in one write and flush with it,
// which delays nothing: the client reads them at the same moment either way.
// Every wait also watches the request's context: a client that goes away ends
// the exchange at once and is counted in Stats.Canceled.
//
// A non-streamed request gets its whole JSON response at the deadline of its
// last token event (t0 + TTFT + (E−1)·ITL + jitter), or at t0 + TTFT when it
// has no token event.
//
// # Tokens and text
//
// Let N be the answer tokens (Options.OutputTokens, default 16, or the
// X-Mock-Output-Tokens header), R the reasoning tokens (X-Mock-Reasoning-Tokens,
// default 0) and T the tokens per chunk (default 1). With a max_tokens or
// max_completion_tokens M (which, as on the real APIs, includes reasoning),
// R' = min(R, M) and N' = min(N, M − R'); when N' < N the finish reason is
// "length" (OpenAI) or "max_tokens" (Anthropic), else "stop" / "end_turn", or
// "tool_calls" / "tool_use" for a tool call.
//
// Answer token i (1-based) is the word " tok<i>", reasoning token i is
// " think<i>"; so the answer text of N' tokens is Text(N'). Each token event
// carries T tokens, the last one of a run fewer: ceil(R'/T) reasoning events
// (OpenAI delta.reasoning_content; Anthropic a thinking block with
// thinking_delta events, then a signature_delta), then ceil(N'/T) answer
// events.
//
// # Tool calls
//
// Offering tools does not make the mock call one: coding agents (Claude
// Code, Codex, opencode) offer tools on every request and run every call
// they get back, so a mock that called a tool whenever one was offered
// kept them looping. A request that offers tools gets a tool call only when
// it asks for one:
//
//   - X-Mock-Tool-Call: 1 calls the first offered tool, and
//     X-Mock-Tool-Call: <name> the offered tool of that name (a name no
//     offered tool has is a 400); or
//   - the text of the last user message (a Responses string input is one)
//     names an offered tool: its whole
//     name, case-sensitive, not inside a longer name (no ASCII letter,
//     digit, '_' or '-' next to it), so "Use get_weather." names
//     get_weather and "get_weather_v2" does not. When it names several,
//     the first in the tools array is called.
//
// Anything else is a text answer, and so is every request whose last input
// item is a tool result, the header notwithstanding: a Chat Completions
// message with role "tool" (or "function"), a Messages user message holding
// a tool_result block (whatever text blocks come with it), a Responses item
// whose type ends in "_call_output" (function_call_output, ...). An agent's
// loop thus ends after one round of calls. A request without tools gets text
// whatever it asks.
//
// The call passes the arguments {"city": "Bergen"} (ToolArguments; the
// X-Mock-Tool-Arguments header, a JSON object, replaces them), cut into
// fragments, one per token event: OpenAI sends the tool call's id, type and
// name (arguments "") as the first token event and the fragments after it;
// Anthropic opens a tool_use block and sends the fragments as input_json_delta
// events. The arguments are cut into as many fragments as the untruncated
// answer has token events (at most one per byte); a max_tokens cut sends only
// the first ceil(N'/T) events, leaving the arguments unfinished as the real
// APIs do.
//
// # Usage
//
// The base input count is InputTokens(body) = ceil(len(body)/4). With
// X-Mock-Cached-Tokens C, OpenAI reports prompt_tokens = base + C with
// prompt_tokens_details.cached_tokens = C (cached tokens are part of the
// prompt), and Anthropic reports input_tokens = base with
// cache_read_input_tokens = C (they are not), so the normalised input is
// base + C in both dialects. Output is R' + N' (completion_tokens with
// completion_tokens_details.reasoning_tokens = R'; Anthropic output_tokens,
// cumulative in message_delta). OpenAI streams carry "usage":null on every
// chunk, and the usage-only chunk ("choices":[]) before data: [DONE] only when
// the request sets stream_options.include_usage and X-Mock-No-Usage is not 1.
//
// # Per-request overrides
//
// Request headers, all optional, override Options for one request:
// X-Mock-TTFT-Ms, X-Mock-ITL-Ms, X-Mock-Jitter-Ms (non-negative decimals),
// X-Mock-Output-Tokens, X-Mock-Tokens-Per-Chunk (positive integers),
// X-Mock-Cached-Tokens, X-Mock-Reasoning-Tokens (non-negative integers),
// X-Mock-No-Usage (1/true), X-Mock-Tool-Call (1 or a tool's name; see Tool
// calls), and X-Mock-Fault, a ';'-separated list of:
//
//	status=<400..599>   answer with that status and a dialect error body
//	retry-after=<s>     with status: the Retry-After header
//	retry-after-ms=<ms> with status: the retry-after-ms header, which the
//	                    OpenAI and Anthropic SDKs read before Retry-After
//	type=<s>, code=<s>  with status: override error.type (both dialects) and
//	                    the OpenAI error.code (e.g. insufficient_quota)
//	disconnect=<n>      after n token events, abort the connection (no terminal marker)
//	error-event=<n>     after n token events, send the dialect's error event and end the body
//	malformed=<n>       after n token events, send one event with truncated JSON, then go on
//	hang=<n>            after n token events, go silent with the connection open
//	                    until the client leaves (counted in Stats.Canceled)
//	stall=<ms>          wait that long before writing the response headers
//
// The two retry hints are sent verbatim and independently: give both to test
// a client's precedence, one to test it alone. An n at or past the number of
// token events fires after the last one, before the finish events; faults
// due at the same n fire in the order malformed, error-event, disconnect,
// hang, and the first that ends the body wins. A status answers at once
// (after any stall) and the stream faults do not fire. Faults apply to the
// three generation routes. On a non-streamed request disconnect sends half of
// the body and aborts, malformed sends a truncated body, hang writes nothing,
// headers included, until the client leaves, and error-event is a 400 (it
// needs a stream).
//
// # Injected faults
//
// A retrying client resends the same headers, so a header cannot make a
// first attempt fail and the retry succeed. Server.Inject(spec, n) queues a
// fault for the next n generation requests: each takes the spec in place of
// its own X-Mock-Fault header, in the order the requests pass validation,
// and successive calls queue up behind each other (Inject("status=429", 1)
// then Inject("stall=500", 2): the first request gets a 429, the next two
// stall, the fourth is served as its headers say). The spec is parsed when
// Inject is called; an empty spec means a normal answer. A request rejected
// before generation (bad JSON, a bad X-Mock-* header, a wrong key, a wrong
// method) does not use up an injected fault; a non-streamed request that
// takes error-event does, and gets its 400. Server.ClearInjected drops what
// is left. Stats.Injected counts the requests that took an injected fault;
// Stats.Faults counts every request that took a fault, header or injected.
//
// # Stored state
//
// Every POST /v1/responses answered with HTTP 200, streamed or not, is
// kept unless its body sets "store": false: its final object (the
// non-streamed body, or the terminal event's response, response.failed's
// for the error-event fault), its body and its input items. At most 10000
// responses and 256 MiB are kept, and the same again for conversations; the
// oldest go first. The object is stored before its last byte is written, so
// a client that has read an answer can retrieve it at once. The response
// object echoes "background", "store", and "previous_response_id" and
// "conversation" {"id"} when the request names them.
//
// A request with "background": true (which needs store) is finished at
// once: its final object is stored before the answer starts, and stays so if
// the client leaves. Without stream it is answered immediately, not on the
// schedule, with the object in status "queued" and "usage": null; a later
// GET gives it completed. With stream its response.created event carries
// status "queued", the rest of the stream is as usual, and GET
// /v1/responses/{id}?stream=true (or, as openai-go's GetStreaming sends it,
// a GET with the JSON body {"stream":true}) streams it again: the original
// body runs through the same code with the same sequence number and
// created_at, so ids, events, sequence numbers and the X-Mock-* timing are
// the original's, on a schedule restarted at the GET; of the original's
// fault only error-event is repeated. starting_after=N leaves out the
// events numbered up to N. Any other response streamed this way is a 404,
// as on the real API. Cancel turns a background response's status into
// "cancelled" (and returns that same object again on a second cancel); a
// synchronous one answers 400 "Cannot cancel a synchronous response.".
//
// Input items are stored as the API lists them: a string input becomes one
// user message with an input_text part, an array element with a role and no
// type a message (string content becomes one input_text part, output_text for
// the assistant), and an item without an id gets one such as
// msg_mock00000003_0 (type prefix, request sequence number, position). The
// item lists (input_items, conversation items) take after, limit (1 to 100,
// default 20) and order (asc, or desc, the default: newest first), and
// answer {"object":"list","data","first_id","last_id","has_more"}, the ids
// null when the page is empty.
//
// previous_response_id must name a stored response (else 400
// previous_response_not_found), conversation ("conv_…" or {"id"}) a
// conversation (else 404 "Conversation with id '…' not found.", param
// conversation), and not both (400 mutually_exclusive_parameters). The
// mock's answer does not depend on them: input tokens count the body only.
// A response in a conversation appends its input items, then its output
// items, to it, unless it failed. An unknown response, conversation or item
// id on a path is a 404 "… with id '…' not found." and a wrong method a 405
// naming the allowed ones in Allow. These routes take no X-Mock-* header and
// no injected fault; Stats counts an answer as Completed and a 4xx as a
// BadRequest.
package mockllm
