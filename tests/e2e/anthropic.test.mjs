// End-to-end: the Anthropic Messages API of `kestrel serve` (POST /v1/messages), driven by the
// official @anthropic-ai/sdk: messages.create, messages.stream(...).finalMessage() equal to the
// non-streamed message, a tool_use / tool_result round trip, stop sequences, count_tokens,
// Anthropic-shaped errors, and x-api-key authentication.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Server, curl, ms } from './lib/harness.mjs';

const T = { timeout: ms(90_000) };
let server;
let client;
let Anthropic;
let MODEL;

async function loadAnthropic() {
  try {
    return (await import('@anthropic-ai/sdk')).default;
  } catch (e) {
    throw new Error(`the @anthropic-ai/sdk npm package is missing (run scripts/setup.sh, or npm ci in tests/e2e): ${e.message}`);
  }
}

// The SDK appends /v1/messages to the base URL (the server's origin).
function makeClient(s, apiKey = 'unused') {
  return new Anthropic({ apiKey, baseURL: s.origin, maxRetries: 0, timeout: ms(60_000) });
}

before(async () => {
  server = await new Server().start();
  Anthropic = await loadAnthropic();
  client = makeClient(server);
  MODEL = (await curl(server, '/v1/models')).json.data[0].id;
});

after(async () => {
  const r = await server?.stop();
  assert.equal(r?.code, 0, `kestrel serve exit: ${JSON.stringify(r)}\n${server?.output}`);
});

const TOOLS = [{
  name: 'get_weather',
  description: 'Current weather of a city',
  input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
}];

// tool_use ids are random: compare messages without them.
// Only the API's fields (the SDK's helpers add some of their own, e.g. parsed_output).
function comparable(message) {
  return {
    type: message.type,
    role: message.role,
    model: message.model,
    stop_reason: message.stop_reason,
    stop_sequence: message.stop_sequence,
    usage: message.usage,
    content: message.content.map((b) => {
      if (b.type !== 'tool_use') return b;
      assert.match(b.id, /^toolu_/);
      return { ...b, id: undefined };
    }),
  };
}

test('messages.create: the message object', T, async () => {
  const m = await client.messages.create({
    model: MODEL, max_tokens: 12, temperature: 0, system: 'You write Python.',
    messages: [{ role: 'user', content: 'def fibonacci(n):' }],
    metadata: { user_id: 'e2e' },
  });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_/);
  assert.equal(m.model, MODEL);
  assert.ok(['end_turn', 'max_tokens'].includes(m.stop_reason), m.stop_reason);
  assert.equal(m.stop_sequence, null);
  assert.ok(Array.isArray(m.content));
  for (const b of m.content) assert.equal(b.type, 'text');
  assert.ok(m.usage.input_tokens > 0);
  assert.ok(m.usage.output_tokens > 0 && m.usage.output_tokens <= 12);
  assert.equal(m.usage.cache_creation_input_tokens, 0);
  assert.equal(typeof m.usage.cache_read_input_tokens, 'number');
  // The same prompt again: its prefix comes from the cache, input_tokens counts the rest.
  const again = await client.messages.create({
    model: MODEL, max_tokens: 12, temperature: 0, system: 'You write Python.',
    messages: [{ role: 'user', content: 'def fibonacci(n):' }],
  });
  assert.ok(again.usage.cache_read_input_tokens > 0);
  assert.equal(again.usage.input_tokens + again.usage.cache_read_input_tokens,
    m.usage.input_tokens + m.usage.cache_read_input_tokens);
  assert.deepEqual(again.content, m.content);
});

test('messages.stream().finalMessage() equals the non-streamed message', T, async () => {
  for (const params of [
    { model: MODEL, max_tokens: 24, temperature: 0, messages: [{ role: 'user', content: 'class Stack:' }] },
    { model: MODEL, max_tokens: 16, temperature: 0, tools: TOOLS, messages: [{ role: 'user', content: 'Weather in Paris?' }] },
  ]) {
    const plain = await client.messages.create(params);
    const stream = client.messages.stream(params);
    let text = '';
    stream.on('text', (delta) => { text += delta; });
    const final = await stream.finalMessage();
    const plainComparable = comparable(plain);
    const finalComparable = comparable(final);
    // cache reads differ between the two runs; the rest must not.
    for (const x of [plainComparable, finalComparable]) x.usage = { ...x.usage, input_tokens: undefined, cache_read_input_tokens: undefined };
    assert.deepEqual(finalComparable, plainComparable);
    assert.equal(text, plain.content.filter((b) => b.type === 'text').map((b) => b.text).join(''));
  }
  // Raw events: message_start first, message_stop last, ping allowed.
  const raw = await curl(server, '/v1/messages', { json: { model: MODEL, max_tokens: 4, stream: true, messages: [{ role: 'user', content: 'x' }] } });
  assert.match(raw.contentType, /text\/event-stream/);
  const types = [...raw.body.matchAll(/^event: (\S+)$/gm)].map((x) => x[1]);
  assert.equal(types[0], 'message_start');
  assert.equal(types.at(-1), 'message_stop');
  assert.equal(types.at(-2), 'message_delta');
});

test('tool_use / tool_result round trip and tool_choice', T, async () => {
  const messages = [
    { role: 'user', content: 'What is the weather in Paris?' },
    {
      role: 'assistant',
      content: [
        { type: 'text', text: 'Let me check.' },
        { type: 'tool_use', id: 'toolu_01A', name: 'get_weather', input: { city: 'Paris' } },
      ],
    },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01A', content: '18C and clear' }] },
  ];
  const first = await client.messages.create({ model: MODEL, max_tokens: 8, temperature: 0, tools: TOOLS, messages: messages.slice(0, 1) });
  const r = await client.messages.create({ model: MODEL, max_tokens: 8, temperature: 0, tools: TOOLS, messages });
  assert.ok(['end_turn', 'max_tokens', 'tool_use'].includes(r.stop_reason));
  assert.equal(r.stop_reason === 'tool_use', r.content.some((b) => b.type === 'tool_use'));
  const total = (u) => u.input_tokens + u.cache_read_input_tokens;
  assert.ok(total(r.usage) > total(first.usage) + 10, 'the call and its result are in the prompt');
  // tool_result with blocks and is_error; tool_choice any / tool / none accepted.
  const blocks = structuredClone(messages);
  blocks[2].content[0] = { type: 'tool_result', tool_use_id: 'toolu_01A', is_error: true, content: [{ type: 'text', text: 'timeout' }] };
  for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }, { type: 'none' }, { type: 'auto', disable_parallel_tool_use: true }]) {
    const x = await client.messages.create({ model: MODEL, max_tokens: 2, tools: TOOLS, tool_choice, messages: blocks });
    assert.equal(x.type, 'message');
  }
  const count = await client.messages.countTokens({ model: MODEL, tools: TOOLS, messages });
  assert.equal(count.input_tokens, total(r.usage));
});

test('stop_sequences: stop_reason stop_sequence names the one that matched', T, async () => {
  const params = { model: MODEL, max_tokens: 32, temperature: 0, messages: [{ role: 'user', content: 'def fibonacci(n):' }] };
  const full = await client.messages.create(params);
  const text = full.content.map((b) => b.text).join('');
  assert.ok(text.length >= 8, `need some text: ${JSON.stringify(text)}`);
  const stop = text.slice(4, 7);
  const cut = await client.messages.create({ ...params, stop_sequences: ['\u0001never', stop] });
  assert.equal(cut.stop_reason, 'stop_sequence');
  assert.equal(cut.stop_sequence, stop);
  assert.equal(cut.content.map((b) => b.text).join(''), text.slice(0, text.indexOf(stop)));
  const streamed = await client.messages.stream({ ...params, stop_sequences: ['\u0001never', stop] }).finalMessage();
  assert.equal(streamed.stop_reason, 'stop_sequence');
  assert.equal(streamed.stop_sequence, stop);
});

test('errors are Anthropic-shaped with the right status; the server keeps serving', T, async () => {
  const good = { model: MODEL, max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] };
  const cases = [
    [{ ...good, max_tokens: undefined }, 400, 'invalid_request_error'],
    [{ ...good, messages: [] }, 400, 'invalid_request_error'],
    [{ ...good, messages: [{ role: 'system', content: 'x' }] }, 400, 'invalid_request_error'],
    [{ ...good, temperature: 3 }, 400, 'invalid_request_error'],
    [{ ...good, tools: [{ type: 'web_search_20250305', name: 'web_search' }] }, 400, 'invalid_request_error'],
    [{ ...good, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: '' } }] }] }, 400, 'invalid_request_error'],
    [{ ...good, model: 'claude-sonnet-4-5' }, 404, 'not_found_error'],
  ];
  for (const [body, status, type] of cases) {
    const r = await curl(server, '/v1/messages', { json: body });
    assert.equal(r.status, status, `${JSON.stringify(body).slice(0, 120)}: ${r.body}`);
    assert.equal(r.json.type, 'error', r.body);
    assert.equal(r.json.error.type, type, r.body);
    assert.equal(typeof r.json.error.message, 'string');
  }
  const malformed = await curl(server, '/v1/messages', { data: '{"model": ' });
  assert.equal(malformed.status, 400);
  assert.equal(malformed.json.type, 'error');
  // The SDK raises its typed errors.
  await assert.rejects(client.messages.create({ ...good, max_tokens: 0 }),
    (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.error?.type === 'invalid_request_error');
  await assert.rejects(client.messages.create({ ...good, model: 'nope' }), (e) => e instanceof Anthropic.NotFoundError);
  const ok = await client.messages.create(good);
  assert.equal(ok.type, 'message');
});

test('--api-key: x-api-key (the SDK) and Authorization: Bearer both work', T, async () => {
  const key = 'sk-ant-e2e';
  const s = await new Server({ args: ['--api-key', key] }).start();
  try {
    const body = { model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: 'hi' }] };
    await assert.rejects(makeClient(s, 'wrong').messages.create(body),
      (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error?.error?.type === 'authentication_error');
    const m = await makeClient(s, key).messages.create(body);
    assert.equal(m.type, 'message');
    const bearer = await curl(s, '/v1/messages', { json: body, headers: { Authorization: `Bearer ${key}` } });
    assert.equal(bearer.status, 200);
    const none = await curl(s, '/v1/messages', { json: body });
    assert.equal(none.status, 401);
    assert.equal(none.json.error.type, 'authentication_error');
    // x-api-key works on the OpenAI routes too.
    const chat = await curl(s, '/v1/chat/completions', { json: { model: MODEL, messages: body.messages, max_tokens: 1 }, headers: { 'x-api-key': key } });
    assert.equal(chat.status, 200);
  } finally {
    const r = await s.stop();
    assert.equal(r.code, 0);
  }
});
