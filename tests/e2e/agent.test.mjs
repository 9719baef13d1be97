// End-to-end: what coding agents use beside plain chat, driven by the official openai SDK.
// Tools and tool messages through the chat template, tool_choice / parallel_tool_calls
// validation, streams reassembled by the SDK's helpers equal to the non-streamed answers (the
// output parsers run on whatever the tiny model writes; their formats are unit-tested in
// tests/server/output_parser_test.cpp), n > 1, echo, and the Responses API with
// previous_response_id, store, GET and DELETE.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Server, loadOpenAI, curl, parseSSE, assertErrorShape, ms } from './lib/harness.mjs';

const T = { timeout: ms(90_000) };
let server;
let client;
let OpenAI;
let MODEL;

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Current weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
    },
  },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];

// A conversation with a finished tool round trip: assistant tool_calls, then the tool's result.
const ROUND_TRIP = [
  { role: 'system', content: 'You are a helpful assistant.' },
  { role: 'user', content: 'What is the weather in Paris?' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [{ id: 'call_abc123', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris", "days": 1}' } }],
  },
  { role: 'tool', tool_call_id: 'call_abc123', content: '{"temperature": 18, "sky": "clear"}' },
];

before(async () => {
  server = await new Server().start();
  OpenAI = await loadOpenAI();
  client = new OpenAI({ apiKey: 'unused', baseURL: server.baseURL, maxRetries: 0, timeout: ms(60_000) });
  MODEL = (await client.models.list()).data[0].id;
});

after(async () => {
  const r = await server?.stop();
  assert.equal(r?.code, 0, `kestrel serve exit: ${JSON.stringify(r)}\n${server?.output}`);
});

// The message without the random tool-call ids (and the SDK-only fields of its helpers).
function comparable(message) {
  const m = { role: message.role, content: message.content ?? null };
  if (message.tool_calls?.length) {
    m.tool_calls = message.tool_calls.map((c) => {
      assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
      assert.equal(c.type, 'function');
      return { name: c.function.name, arguments: c.function.arguments };
    });
  }
  return m;
}

test('the server reads the tool-call format from the chat template', T, async () => {
  assert.match(server.output, /tool calls: hermes, reasoning: none \(from the chat template\)/);
});

test('chat with tools and a tool round trip: rendered through the template, answered', T, async () => {
  const plain = await client.chat.completions.create({ model: MODEL, messages: ROUND_TRIP.slice(0, 2), max_tokens: 8, temperature: 0 });
  const withTools = await client.chat.completions.create({ model: MODEL, messages: ROUND_TRIP.slice(0, 2), tools: TOOLS, max_tokens: 8, temperature: 0 });
  // The template lists the tools in the system turn: the prompt grows.
  assert.ok(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 50,
    `${withTools.usage.prompt_tokens} vs ${plain.usage.prompt_tokens}`);
  // tool_choice "none": the tools are not shown to the model.
  const none = await client.chat.completions.create({ model: MODEL, messages: ROUND_TRIP.slice(0, 2), tools: TOOLS, tool_choice: 'none', max_tokens: 8, temperature: 0 });
  assert.equal(none.usage.prompt_tokens, plain.usage.prompt_tokens);

  const r = await client.chat.completions.create({ model: MODEL, messages: ROUND_TRIP, tools: TOOLS, max_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason), c.finish_reason);
  assert.equal(c.finish_reason === 'tool_calls', (c.message.tool_calls?.length ?? 0) > 0);
  // The assistant call and the tool result are in the prompt: longer than without them.
  assert.ok(r.usage.prompt_tokens > withTools.usage.prompt_tokens + 20);
  // Arguments may also be sent as an object-less string; both render.
  const rawArgs = structuredClone(ROUND_TRIP);
  rawArgs[2].tool_calls[0].function.arguments = 'not json';
  const r2 = await client.chat.completions.create({ model: MODEL, messages: rawArgs, tools: TOOLS, max_tokens: 2 });
  assert.equal(r2.choices.length, 1);
});

test('streams reassembled by the SDK equal the non-streamed answer (tools on, greedy)', T, async () => {
  for (const messages of [ROUND_TRIP, [{ role: 'user', content: 'def fibonacci(n):' }]]) {
    const params = { model: MODEL, messages, tools: TOOLS, max_tokens: 24, temperature: 0 };
    const plain = await client.chat.completions.create(params);
    const stream = client.chat.completions.stream(params);
    const final = await stream.finalChatCompletion();
    assert.deepEqual(comparable(final.choices[0].message), comparable(plain.choices[0].message));
    assert.equal(final.choices[0].finish_reason, plain.choices[0].finish_reason);
  }
});

test('tools and tool_choice are validated (400 naming the field), the server keeps serving', T, async () => {
  const base = { model: MODEL, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 };
  const cases = [
    [{ tools: [{ type: 'retrieval' }] }, 'tools[0].type'],
    [{ tools: [{ type: 'function', function: { description: 'no name' } }] }, 'tools[0].function.name'],
    [{ tools: [{ type: 'function', function: { name: 'f', parameters: 'object' } }] }, 'tools[0].function.parameters'],
    [{ tools: [TOOLS[0], TOOLS[0]] }, 'tools[1].function.name'],
    [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'unknown_fn' } } }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ tools: TOOLS, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools: TOOLS, parallel_tool_calls: 'no' }, 'parallel_tool_calls'],
  ];
  for (const [extra, param] of cases) {
    await assert.rejects(client.chat.completions.create({ ...base, ...extra }), (e) => {
      assert.ok(e instanceof OpenAI.BadRequestError, `${param}: ${e}`);
      assert.equal(e.param, param, `${JSON.stringify(extra)}: ${e.message}`);
      return true;
    });
  }
  // Accepted (their enforcement comes with the grammar engine; docs/server.md).
  for (const tool_choice of ['required', { type: 'function', function: { name: 'get_time' } }, 'auto', 'none']) {
    const r = await client.chat.completions.create({ ...base, tools: TOOLS, tool_choice, parallel_tool_calls: false });
    assert.equal(r.choices.length, 1);
  }
});

test('n > 1: choices indexed, seeded choices reproducible, streamed = non-streamed', T, async () => {
  const params = { model: MODEL, messages: [{ role: 'user', content: 'Write a function.' }], max_tokens: 12, temperature: 0.9, seed: 11, n: 3 };
  const a = await client.chat.completions.create(params);
  assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
  const b = await client.chat.completions.create(params);
  assert.deepEqual(b.choices.map((c) => c.message.content), a.choices.map((c) => c.message.content));
  assert.ok(new Set(a.choices.map((c) => c.message.content)).size > 1, 'seed + i: the choices differ');
  // The prompt counts once; completion tokens add up over the choices.
  const one = await client.chat.completions.create({ ...params, n: 1 });
  assert.equal(a.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.ok(a.usage.completion_tokens > one.usage.completion_tokens);

  const stream = client.chat.completions.stream({ ...params, stream_options: { include_usage: true } });
  const indexes = new Set();
  stream.on('chunk', (chunk) => { for (const c of chunk.choices) indexes.add(c.index); });
  const final = await stream.finalChatCompletion();
  assert.deepEqual([...indexes].sort(), [0, 1, 2]);
  assert.deepEqual(final.choices.map((c) => c.message.content), a.choices.map((c) => c.message.content));
  assert.deepEqual(final.choices.map((c) => c.finish_reason), a.choices.map((c) => c.finish_reason));
  assert.equal(final.usage.completion_tokens, a.usage.completion_tokens);

  const comp = await client.completions.create({ model: MODEL, prompt: 'def add(a, b):', max_tokens: 8, temperature: 0, n: 2 });
  assert.deepEqual(comp.choices.map((c) => c.index), [0, 1]);
  assert.equal(comp.choices[0].text, comp.choices[1].text, 'greedy choices are equal');
  for (const n of [0, 17]) {
    await assert.rejects(client.completions.create({ model: MODEL, prompt: 'x', n }), (e) => e.status === 400 && e.param === 'n');
  }
});

test('completions echo: the prompt before each choice, streamed and not', T, async () => {
  const prompt = 'def fibonacci(n):';
  const base = { model: MODEL, prompt, max_tokens: 8, temperature: 0 };
  const plain = await client.completions.create(base);
  const echoed = await client.completions.create({ ...base, echo: true, n: 2 });
  for (const c of echoed.choices) assert.equal(c.text, prompt + plain.choices[0].text);
  const stream = await client.completions.create({ ...base, echo: true, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, prompt + plain.choices[0].text);
  // Token-id prompts echo their text.
  const ids = await client.completions.create({ model: MODEL, prompt: [1734, 1013], max_tokens: 1, echo: true });
  assert.ok(ids.choices[0].text.length > 0);
  await assert.rejects(client.completions.create({ ...base, echo: true, logprobs: 2 }),
    (e) => e.status === 400 && e.param === 'echo');
});

test('responses: create, stream helper = non-streamed, previous_response_id, store, GET/DELETE', T, async () => {
  const params = { model: MODEL, instructions: 'You write Python.', input: 'def fibonacci(n):', max_output_tokens: 16, temperature: 0 };
  const r = await client.responses.create(params);
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_/);
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(r.model, MODEL);
  assert.equal(r.instructions, 'You write Python.');
  assert.equal(typeof r.output_text, 'string');
  assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);

  const stream = client.responses.stream(params);
  const deltas = [];
  stream.on('response.output_text.delta', (e) => deltas.push(e.delta));
  const final = await stream.finalResponse();
  assert.equal(final.output_text, r.output_text);
  assert.equal(deltas.join(''), r.output_text);
  assert.equal(final.status, r.status);
  assert.deepEqual(final.output.map((o) => o.type), r.output.map((o) => o.type));

  // Raw events: created first, completed/incomplete last, sequence numbers in order.
  const raw = await curl(server, '/v1/responses', { json: { ...params, stream: true } });
  const events = [];
  for (const block of raw.body.split('\n\n')) {
    const data = block.split('\n').find((l) => l.startsWith('data: '));
    if (data) events.push(JSON.parse(data.slice(6)));
  }
  assert.equal(events[0].type, 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(events.at(-1).type));
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));

  // A follow-up continues the stored conversation: its prompt holds the first turn.
  // Instructions are not carried over (as OpenAI does): they are sent again.
  const followUp = { model: MODEL, instructions: params.instructions, input: 'Now in C.', max_output_tokens: 4, temperature: 0 };
  const next = await client.responses.create({ ...followUp, previous_response_id: r.id });
  const fresh = await client.responses.create(followUp);
  assert.equal(next.previous_response_id, r.id);
  assert.ok(next.usage.input_tokens > fresh.usage.input_tokens + 5);
  // The first turn's prompt is a prefix of the follow-up's: served from the prefix cache.
  assert.ok(next.usage.input_tokens_details.cached_tokens > 0);

  // Function tools and a function_call / function_call_output round trip as input items.
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather', parameters: TOOLS[0].function.parameters, strict: false }];
  const items = await client.responses.create({
    model: MODEL, tools, max_output_tokens: 4, input: [
      { role: 'user', content: 'Weather in Paris?' },
      { type: 'function_call', call_id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { type: 'function_call_output', call_id: 'call_1', output: '18C' },
    ],
  });
  assert.ok(['completed', 'incomplete'].includes(items.status));
  assert.deepEqual(items.tools.map((t) => t.name), ['get_weather']);

  // GET returns the stored response; store: false is not kept; DELETE forgets.
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.equal(got.output_text, r.output_text);
  const unstored = await client.responses.create({ ...params, store: false });
  assert.equal(unstored.store, false);
  await assert.rejects(client.responses.retrieve(unstored.id), (e) => e.status === 404);
  await assert.rejects(client.responses.create({ model: MODEL, previous_response_id: unstored.id, input: 'x' }),
    (e) => e.status === 400 && e.code === 'previous_response_not_found' && e.param === 'previous_response_id');
  const del = await curl(server, `/v1/responses/${r.id}`, { method: 'DELETE' });
  assert.equal(del.status, 200);
  assert.deepEqual(del.json, { id: r.id, object: 'response', deleted: true });
  await assert.rejects(client.responses.retrieve(r.id), (e) => e.status === 404);
});

test('responses: bad input gets a 400 naming the field', T, async () => {
  const cases = [
    [{ input: 5 }, 'input'],
    [{ input: [{ type: 'item_reference', id: 'x' }] }, 'input[0].type'],
    [{ input: 'x', tools: [{ type: 'web_search_preview' }] }, 'tools[0].type'],
    [{ input: 'x', tool_choice: { type: 'function', name: 'nope' }, tools: [{ type: 'function', name: 'f' }] }, 'tool_choice'],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    [{ input: 'x', text: { format: { type: 'json_object' } } }, 'text.format.type'],
  ];
  for (const [body, param] of cases) {
    const r = await curl(server, '/v1/responses', { json: { model: MODEL, ...body } });
    assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.body}`);
    const e = assertErrorShape(assert, r.body, r.status, param);
    assert.equal(e.param, param, e.message);
  }
  const ok = await curl(server, '/v1/responses', { json: { model: MODEL, input: 'x', max_output_tokens: 1 } });
  assert.equal(ok.status, 200);
  const sse = parseSSE((await curl(server, '/v1/chat/completions', { json: { model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 1, stream: true } })).body);
  assert.ok(sse.done);
});

// Reasoning end to end, deterministically: with --reasoning-parser think, a prompt that ends
// inside <think> (here the assistant message is continued: `continue_final_message` on chat,
// a prefill on /v1/messages) makes the whole output reasoning, which the default server returns
// as content. Greedy, so both servers write the same text.
test('reasoning: a prompt that opens <think> gives reasoning_content (chat) and a thinking block (messages)', T, async () => {
  const thinking = await new Server({ args: ['--reasoning-parser', 'think'] }).start();
  try {
    assert.match(thinking.output, /tool calls: hermes, reasoning: <think>\n/);
    const tc = new OpenAI({ apiKey: 'unused', baseURL: thinking.baseURL, maxRetries: 0, timeout: ms(60_000) });
    const messages = [{ role: 'user', content: 'def fibonacci(n):' }, { role: 'assistant', content: '<think>' }];
    const params = { model: MODEL, messages, max_tokens: 16, temperature: 0, continue_final_message: true };
    const plain = await client.chat.completions.create(params);
    const text = plain.choices[0].message.content;
    assert.ok(text.length > 0 && !text.includes('</think>'), JSON.stringify(text));

    const r = await tc.chat.completions.create(params);
    assert.equal(r.choices[0].message.reasoning_content, text);
    assert.equal(r.choices[0].message.content, '');
    // Streamed: reasoning_content deltas (the SDK keeps only the last one in its snapshot, so
    // they are gathered from the chunks).
    let reasoning = '';
    let content = '';
    const stream = tc.chat.completions.stream(params);
    stream.on('chunk', (chunk) => {
      const d = chunk.choices[0]?.delta ?? {};
      reasoning += d.reasoning_content ?? '';
      content += d.content ?? '';
    });
    await stream.finalChatCompletion();
    assert.equal(reasoning, text);
    assert.equal(content, '');

    // Without the open block the same server parses nothing: no reasoning.
    const open = await tc.chat.completions.create({ model: MODEL, messages: messages.slice(0, 1), max_tokens: 8, temperature: 0 });
    assert.equal(open.choices[0].message.reasoning_content, undefined);

    // Anthropic: the prefill continues, the output is one thinking block.
    const anthropic = await curl(thinking, '/v1/messages', { json: { model: MODEL, max_tokens: 16, temperature: 0, messages } });
    assert.equal(anthropic.status, 200, anthropic.body);
    assert.deepEqual(anthropic.json.content, [{ type: 'thinking', thinking: text, signature: '' }]);
    const anthropicStream = await curl(thinking, '/v1/messages', { json: { model: MODEL, max_tokens: 16, temperature: 0, messages, stream: true } });
    const deltas = [...anthropicStream.body.matchAll(/^data: (.*)$/gm)].map((m) => JSON.parse(m[1]))
      .filter((e) => e.type === 'content_block_delta');
    assert.ok(deltas.length > 0 && deltas.every((e) => e.delta.type === 'thinking_delta'));
    assert.equal(deltas.map((e) => e.delta.thinking).join(''), text);
  } finally {
    const r = await thinking.stop();
    assert.equal(r.code, 0);
  }
});
