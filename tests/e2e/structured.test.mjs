// End-to-end: structured output through the official openai SDK on the embedded model, whose
// free output is not JSON. response_format json_schema / json_object, vLLM's structured_outputs
// (regex, choice), and tool_choice "required" / a named function: every answer follows its
// grammar (sampled at temperature 1, several choices), streamed answers reassemble to valid
// output, and bad schemas are 400s that name the problem.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Server, loadOpenAI, ms } from './lib/harness.mjs';

const T = { timeout: ms(120_000) };
let server;
let client;
let OpenAI;
let MODEL;

before(async () => {
  server = await new Server().start();
  OpenAI = await loadOpenAI();
  client = new OpenAI({ apiKey: 'unused', baseURL: server.baseURL, maxRetries: 0, timeout: ms(90_000) });
  MODEL = (await client.models.list()).data[0].id;
});

after(async () => {
  const r = await server?.stop();
  assert.equal(r?.code, 0, `kestrel serve exit: ${JSON.stringify(r)}\n${server?.output}`);
});

const PERSON = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    role: { enum: ['admin', 'user'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 6 }, maxItems: 3 },
  },
  required: ['name', 'age', 'role', 'tags'],
  additionalProperties: false,
};

function checkPerson(text) {
  const p = JSON.parse(text);
  assert.deepEqual(Object.keys(p), ['name', 'age', 'role', 'tags']);
  assert.equal(typeof p.name, 'string');
  assert.ok([...p.name].length <= 12);
  assert.ok(Number.isInteger(p.age) && p.age >= 0 && p.age <= 120, `age ${p.age}`);
  assert.ok(['admin', 'user'].includes(p.role));
  assert.ok(Array.isArray(p.tags) && p.tags.length <= 3);
}

const messages = [{ role: 'user', content: 'Describe a user as JSON.' }];

test('response_format json_schema: every choice is valid JSON that validates', T, async () => {
  const r = await client.chat.completions.create({
    model: MODEL, messages, n: 4, temperature: 1, max_tokens: 300, seed: 5,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON, strict: true } },
  });
  assert.equal(r.choices.length, 4);
  for (const c of r.choices) {
    assert.equal(c.finish_reason, 'stop', c.message.content);
    checkPerson(c.message.content);
  }
  // Streamed, reassembled by the SDK.
  const stream = client.chat.completions.stream({
    model: MODEL, messages, temperature: 1, max_tokens: 300, seed: 6,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: PERSON } },
  });
  const done = await stream.finalChatCompletion();
  checkPerson(done.choices[0].message.content);
});

test('response_format json_object and structured_outputs regex / choice', T, async () => {
  const o = await client.chat.completions.create({
    model: MODEL, messages, temperature: 1, max_tokens: 400, seed: 7,
    response_format: { type: 'json_object' },
  });
  if (o.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(o.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(v !== null && !Array.isArray(v));
  } else {
    assert.ok(o.choices[0].message.content.startsWith('{'));
  }
  const re = await client.completions.create({
    model: MODEL, prompt: 'Date: ', temperature: 1, max_tokens: 20, n: 3, seed: 8,
    structured_outputs: { regex: '20[0-9]{2}-(0[1-9]|1[0-2])-[0-2][0-9]' },
  });
  for (const c of re.choices) assert.match(c.text, /^20\d{2}-(0[1-9]|1[0-2])-[0-2]\d$/);
  const ch = await client.completions.create({
    model: MODEL, prompt: 'Answer: ', temperature: 1, max_tokens: 10, n: 3, seed: 9,
    structured_outputs: { choice: ['yes', 'no', 'it depends'] },
  });
  for (const c of ch.choices) assert.ok(['yes', 'no', 'it depends'].includes(c.text), c.text);
});

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      parameters: {
        type: 'object',
        properties: { city: { type: 'string', maxLength: 16 }, days: { type: 'integer', minimum: 1, maximum: 7 } },
        required: ['city', 'days'],
      },
    },
  },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];

function checkCall(call, allowed) {
  assert.equal(call.type, 'function');
  assert.ok(allowed.includes(call.function.name), call.function.name);
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === 'get_weather') {
    assert.equal(typeof args.city, 'string');
    assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7, `days ${args.days}`);
  }
}

test('tool_choice required / named always yields schema-valid calls', T, async () => {
  const q = [{ role: 'user', content: 'What is the weather in Paris?' }];
  const req = await client.chat.completions.create({
    model: MODEL, messages: q, tools: TOOLS, tool_choice: 'required', n: 4, temperature: 1, max_tokens: 1200, seed: 11,
  });
  for (const c of req.choices) {
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.ok(c.message.tool_calls.length >= 1);
    for (const call of c.message.tool_calls) checkCall(call, ['get_weather', 'get_time']);
  }
  const named = await client.chat.completions.create({
    model: MODEL, messages: q, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'get_weather' } },
    n: 3, temperature: 1, max_tokens: 200, seed: 12, parallel_tool_calls: false,
  });
  for (const c of named.choices) {
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls.length, 1);
    checkCall(c.message.tool_calls[0], ['get_weather']);
  }
  // Streamed through the SDK's accumulator.
  const stream = client.chat.completions.stream({
    model: MODEL, messages: q, tools: TOOLS, tool_choice: 'required', temperature: 1, max_tokens: 1200, seed: 13,
  });
  const done = await stream.finalChatCompletion();
  assert.equal(done.choices[0].finish_reason, 'tool_calls');
  for (const call of done.choices[0].message.tool_calls) checkCall(call, ['get_weather', 'get_time']);
});

test('tool_choice required with the Qwen3-Coder XML syntax (--tool-call-parser qwen3_coder)', T, async () => {
  const xml = await new Server({ args: ['--tool-call-parser', 'qwen3_coder'] }).start();
  try {
    const c = new OpenAI({ apiKey: 'unused', baseURL: xml.baseURL, maxRetries: 0, timeout: ms(90_000) });
    const r = await c.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Weather?' }], tools: TOOLS,
      tool_choice: { type: 'function', function: { name: 'get_weather' } }, parallel_tool_calls: false,
      n: 3, temperature: 1, max_tokens: 400, seed: 21,
    });
    for (const choice of r.choices) {
      assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice.message));
      assert.equal(choice.message.tool_calls.length, 1);
      checkCall(choice.message.tool_calls[0], ['get_weather']);
    }
  } finally {
    const r = await xml.stop();
    assert.equal(r?.code, 0);
  }
});

test('bad schemas, regexes and conflicting constraints are 400s naming the problem', T, async () => {
  const cases = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', not: {} } } } }, /not/],
    [{ structured_outputs: { regex: '(unclosed' } }, /regex/],
    [{ structured_outputs: { grammar: 'root ::= "a' } }, /grammar/],
    [{ response_format: { type: 'json_object' }, structured_outputs: { choice: ['a'] } }, /structured_outputs/],
    [{ response_format: { type: 'json_object' }, tools: TOOLS, tool_choice: 'required' }, /tool_choice/],
  ];
  for (const [extra, pattern] of cases) {
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages, max_tokens: 5, ...extra }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && pattern.test(e.message),
      JSON.stringify(extra));
  }
  // Still serving.
  const ok = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 3 });
  assert.equal(ok.choices.length, 1);
});
