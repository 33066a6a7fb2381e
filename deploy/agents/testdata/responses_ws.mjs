// Two turns on one Responses API WebSocket with the openai package's own
// client, ResponsesWS (wire.md 10.7; this version has no
// client.responses.connect()): the second turn chains from the first with
// previous_response_id, as the SDK's example and Codex do. The base URL and
// key come from OPENAI_BASE_URL and OPENAI_API_KEY; any error, a closed
// socket or a failed turn exits non-zero.
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';

const client = new OpenAI({ maxRetries: 0 });
const ws = new ResponsesWS(client);
const events = ws.stream();

async function turn(body) {
  ws.send({ type: 'response.create', ...body });
  let text = '';
  for (;;) {
    const { value, done } = await events.next();
    if (done) throw new Error('the socket closed mid-turn');
    if (value.type === 'error') throw new Error(`socket error: ${value.error.message}`);
    if (value.type === 'close') throw new Error(`the socket closed mid-turn: ${value.code} ${value.reason}`);
    if (value.type !== 'message') continue;
    const m = value.message;
    switch (m.type) {
      case 'response.output_text.delta':
        text += m.delta;
        break;
      case 'response.completed':
        return { id: m.response.id, text: text.trim() };
      case 'response.failed':
      case 'response.incomplete':
      case 'error':
        throw new Error(`turn ended with ${JSON.stringify(m)}`);
    }
  }
}

const model = process.env.MODEL || 'gpt-5.5';
const first = await turn({ model, input: 'say hi' });
console.log(`turn 1 (${first.id}): ${first.text}`);
const second = await turn({ model, input: 'say hi again', previous_response_id: first.id });
console.log(`turn 2 (${second.id}): ${second.text}`);
ws.close({ code: 1000, reason: 'done' });
