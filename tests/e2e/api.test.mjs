// End-to-end: the OpenAI API of `kestrel serve`, driven by the official openai SDK and by curl.
// Chat and text completions (plain and streamed), golden greedy outputs, stop strings, seeded
// sampling, logprobs, logit_bias, the prefix cache (cached_tokens), /v1/models, /health, /metrics.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import {
  Server, loadOpenAI, curl, parseSSE, metricValue, waitIdle, modelDir, longPrompt,
  ms,
} from './lib/harness.mjs';

const T = { timeout: ms(60_000) };
let server;
let client;
let MODEL;
const golden = JSON.parse(readFileSync(path.join(modelDir(), 'golden.json'), 'utf8'));
const EOS_TEXT = /(<\|im_end\|>|<\|endoftext\|>)$/;

before(async () => {
  server = await new Server().start();
  const OpenAI = await loadOpenAI();
  client = new OpenAI({ apiKey: 'unused', baseURL: server.baseURL, maxRetries: 0, timeout: ms(60_000) });
  const models = await client.models.list();
  MODEL = models.data[0].id;
});

after(async () => {
  const r = await server?.stop();
  assert.equal(r?.code, 0, `kestrel serve exit: ${JSON.stringify(r)}\n${server?.output}`);
});

async function collectChatStream(params) {
  const stream = await client.chat.completions.create({ ...params, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

async function collectCompletionStream(params) {
  const stream = await client.completions.create({ ...params, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

test('GET /health and GET /v1/models', T, async () => {
  const h = await curl(server, '/health');
  assert.equal(h.status, 200);
  const models = await client.models.list();
  assert.equal(models.data.length, 1);
  const m = models.data[0];
  assert.equal(m.object, 'model');
  assert.equal(typeof m.id, 'string');
  assert.ok(m.id.length > 0);
  assert.equal(typeof m.created, 'number');
  assert.equal(typeof m.owned_by, 'string');
  const c = await curl(server, '/v1/models');
  assert.equal(c.status, 200);
  assert.equal(c.json.object, 'list');
  assert.deepEqual(c.json.data.map((d) => d.id), [MODEL]);
  const one = await client.models.retrieve(MODEL);
  assert.equal(one.id, MODEL);
  assert.equal(one.object, 'model');
});

test('completions: greedy output equals golden.json (string prompt and token-id prompt)', T, async () => {
  for (const g of golden.cases.filter((c) => c.kind === 'code')) {
    const expected = g.output_text.replace(EOS_TEXT, '');
    const r = await client.completions.create({ model: MODEL, prompt: g.text, max_tokens: golden.max_new_tokens, temperature: 0 });
    assert.equal(r.object, 'text_completion');
    assert.equal(typeof r.id, 'string');
    assert.equal(typeof r.created, 'number');
    assert.equal(r.model, MODEL);
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(r.choices[0].text, expected, `prompt ${JSON.stringify(g.text)}`);
    assert.equal(r.choices[0].finish_reason, g.finish_reason);
    assert.equal(r.usage.prompt_tokens, g.prompt_ids.length);
    // Like OpenAI, the EOS token that ends a 'stop' completion counts as generated.
    const nOut = g.output_ids.length;
    assert.ok(r.usage.completion_tokens === nOut || (g.finish_reason === 'stop' && r.usage.completion_tokens === nOut - 1),
      `completion_tokens ${r.usage.completion_tokens} vs golden ${nOut}`);
    assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);

    const ids = await client.completions.create({ model: MODEL, prompt: g.prompt_ids, max_tokens: golden.max_new_tokens, temperature: 0 });
    assert.equal(ids.choices[0].text, expected, `token-id prompt ${JSON.stringify(g.prompt_ids)}`);
    assert.equal(ids.usage.prompt_tokens, g.prompt_ids.length);
  }
});

test('chat: greedy output equals golden.json; streamed deltas equal the plain response', T, async () => {
  const g = golden.cases.find((c) => c.kind === 'chat');
  const sys = g.text.match(/<\|im_start\|>system\n([\s\S]*?)<\|im_end\|>/)[1];
  const user = g.text.match(/<\|im_start\|>user\n([\s\S]*?)<\|im_end\|>/)[1];
  const messages = [{ role: 'system', content: sys }, { role: 'user', content: user }];
  const expected = g.output_text.replace(EOS_TEXT, '');

  const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 32, temperature: 0, user: 'e2e', n: 1 });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, MODEL);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(r.choices[0].message.content, expected);
  assert.equal(r.choices[0].finish_reason, g.finish_reason);
  assert.equal(r.usage.prompt_tokens, g.prompt_ids.length, 'the chat template renders as transformers does');
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);

  const chunks = await collectChatStream({ model: MODEL, messages, max_tokens: 32, temperature: 0, stream_options: { include_usage: true } });
  assert.ok(chunks.length >= 3);
  const ids = new Set(chunks.map((c) => c.id));
  assert.equal(ids.size, 1, 'one id for the whole stream');
  for (const c of chunks) assert.equal(c.object, 'chat.completion.chunk');
  assert.equal(chunks[0].choices[0].delta.role, 'assistant', 'role chunk first');
  const usageChunk = chunks.at(-1);
  assert.deepEqual(usageChunk.choices, [], 'usage chunk has no choices');
  assert.deepEqual(usageChunk.usage.prompt_tokens, r.usage.prompt_tokens);
  assert.deepEqual(usageChunk.usage.completion_tokens, r.usage.completion_tokens);
  const choiceChunks = chunks.slice(0, -1);
  const finishChunks = choiceChunks.filter((c) => c.choices[0].finish_reason);
  assert.equal(finishChunks.length, 1, 'exactly one finish chunk');
  assert.equal(finishChunks[0], choiceChunks.at(-1), 'finish chunk last among choice chunks');
  assert.equal(finishChunks[0].choices[0].finish_reason, g.finish_reason);
  for (const c of choiceChunks) assert.ok(c.usage == null, 'no usage before the usage chunk');
  const text = choiceChunks.map((c) => c.choices[0].delta.content ?? '').join('');
  assert.equal(text, expected);
});

test('chat: max_completion_tokens and max_tokens bound the output; finish_reason length', T, async () => {
  const messages = [{ role: 'user', content: 'Write a long Python module with many functions.' }];
  const a = await client.chat.completions.create({ model: MODEL, messages, max_completion_tokens: 5, temperature: 0 });
  assert.ok(a.usage.completion_tokens <= 5);
  if (a.usage.completion_tokens === 5) assert.equal(a.choices[0].finish_reason, 'length');
  const b = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 5, temperature: 0 });
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
});

test('curl: chat stream is OpenAI SSE (role chunk, deltas, finish chunk, usage chunk, [DONE])', T, async () => {
  const body = { model: MODEL, messages: [{ role: 'user', content: 'def add(a, b):' }], max_tokens: 12, temperature: 0, stream: true,
    stream_options: { include_usage: true } };
  const r = await curl(server, '/v1/chat/completions', { json: body });
  assert.equal(r.status, 200);
  const { events, done, afterDone } = parseSSE(r.body);
  assert.ok(done, 'ends with data: [DONE]');
  assert.equal(afterDone, 0, 'nothing after [DONE]');
  assert.equal(events[0].choices[0].delta.role, 'assistant');
  assert.equal(events.at(-1).choices.length, 0);
  assert.equal(typeof events.at(-1).usage.completion_tokens, 'number');
  assert.ok(['stop', 'length'].includes(events.at(-2).choices[0].finish_reason));
  for (const e of events.slice(0, -2)) assert.equal(e.choices[0].finish_reason, null);

  const plain = await curl(server, '/v1/chat/completions', { json: { ...body, stream: false, stream_options: undefined } });
  assert.equal(plain.status, 200);
  assert.match(plain.json.id, /./);
  const text = events.slice(0, -1).map((e) => e.choices[0].delta.content ?? '').join('');
  assert.equal(text, plain.json.choices[0].message.content);

  // Without include_usage: no usage chunk.
  const r2 = await curl(server, '/v1/chat/completions', { json: { ...body, stream_options: undefined } });
  const s2 = parseSSE(r2.body);
  assert.ok(s2.done);
  assert.ok(s2.events.every((e) => e.choices.length === 1 && e.usage == null), 'no usage chunk when not asked');
});

test('completions: streamed text equals the plain response (SDK and curl)', T, async () => {
  const params = { model: MODEL, prompt: 'import os\nimport sys\n\ndef main():', max_tokens: 24, temperature: 0 };
  const plain = await client.completions.create(params);
  const chunks = await collectCompletionStream({ ...params, stream_options: { include_usage: true } });
  for (const c of chunks) assert.equal(c.object, 'text_completion');
  const usage = chunks.at(-1);
  assert.deepEqual(usage.choices, []);
  assert.equal(usage.usage.completion_tokens, plain.usage.completion_tokens);
  const text = chunks.slice(0, -1).map((c) => c.choices[0].text).join('');
  assert.equal(text, plain.choices[0].text);
  assert.equal(chunks.at(-2).choices[0].finish_reason, plain.choices[0].finish_reason);

  const r = await curl(server, '/v1/completions', { json: { ...params, stream: true } });
  assert.equal(r.status, 200);
  assert.match(r.contentType, /^text\/event-stream/);
  const { events, done } = parseSSE(r.body);
  assert.ok(done);
  assert.equal(events.map((e) => e.choices[0].text).join(''), plain.choices[0].text);
});

test('stop strings: never emitted, finish_reason stop (plain and streamed, chat and completions)', T, async () => {
  const prompt = 'class Stack:\n    def __init__(self):';
  const full = (await client.completions.create({ model: MODEL, prompt, max_tokens: 32, temperature: 0 })).choices[0].text;
  // golden: '  # type: ignore[misc]\n        self._stack = 0\n ...'
  for (const stop of ['_stack', 'ignore[', ['zzz_never', 'self.'], '\n']) {
    const stops = Array.isArray(stop) ? stop : [stop];
    const cut = Math.min(...stops.map((s) => { const i = full.indexOf(s); return i < 0 ? Infinity : i; }));
    assert.ok(Number.isFinite(cut), `stop ${JSON.stringify(stop)} occurs in ${JSON.stringify(full)}`);
    const expected = full.slice(0, cut);
    const r = await client.completions.create({ model: MODEL, prompt, max_tokens: 32, temperature: 0, stop });
    assert.equal(r.choices[0].text, expected, `stop ${JSON.stringify(stop)}`);
    assert.equal(r.choices[0].finish_reason, 'stop');
    const chunks = await collectCompletionStream({ model: MODEL, prompt, max_tokens: 32, temperature: 0, stop });
    const text = chunks.map((c) => c.choices[0]?.text ?? '').join('');
    assert.equal(text, expected, `streamed, stop ${JSON.stringify(stop)}`);
    for (const s of stops) assert.ok(!text.includes(s));
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  }
  // Chat.
  const messages = [{ role: 'user', content: 'Write a class Stack.' }];
  const chatFull = (await client.chat.completions.create({ model: MODEL, messages, max_tokens: 32, temperature: 0 })).choices[0].message.content;
  const word = chatFull.trim().split(/\s+/).find((w) => w.length >= 3 && chatFull.indexOf(w) > 0);
  if (word) {
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 32, temperature: 0, stop: [word] });
    assert.equal(r.choices[0].message.content, chatFull.slice(0, chatFull.indexOf(word)));
    assert.equal(r.choices[0].finish_reason, 'stop');
    const chunks = await collectChatStream({ model: MODEL, messages, max_tokens: 32, temperature: 0, stop: word });
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), chatFull.slice(0, chatFull.indexOf(word)));
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  }
});

test('seeded sampling: same seed → same text (temperature > 0); seeds differ → some text differs', T, async () => {
  const base = { model: MODEL, prompt: 'def parse_args(argv):', max_tokens: 32, temperature: 1.0, top_p: 0.95 };
  const a = await client.completions.create({ ...base, seed: 1234 });
  const b = await client.completions.create({ ...base, seed: 1234 });
  assert.equal(a.choices[0].text, b.choices[0].text);
  const sa = await collectCompletionStream({ ...base, seed: 1234 });
  assert.equal(sa.map((c) => c.choices[0]?.text ?? '').join(''), a.choices[0].text, 'streaming does not change sampling');
  const texts = new Set([a.choices[0].text]);
  for (const seed of [1, 2, 3]) texts.add((await client.completions.create({ ...base, seed })).choices[0].text);
  assert.ok(texts.size > 1, 'different seeds give different samples');

  const chat = { model: MODEL, messages: [{ role: 'user', content: 'Write a function.' }], max_tokens: 24, temperature: 0.9, top_k: 40, min_p: 0.01, seed: 7 };
  const c1 = await client.chat.completions.create(chat);
  const c2 = await client.chat.completions.create(chat);
  assert.equal(c1.choices[0].message.content, c2.choices[0].message.content);
});

test('logprobs: chat top_logprobs and completions logprobs have the OpenAI shape', T, async () => {
  const r = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'def f(x):' }], max_tokens: 8,
    temperature: 0, logprobs: true, top_logprobs: 3 });
  const content = r.choices[0].logprobs.content;
  assert.ok(Array.isArray(content));
  assert.ok(content.length >= 1 && content.length <= r.usage.completion_tokens);
  for (const t of content) {
    assert.equal(typeof t.token, 'string');
    assert.equal(typeof t.logprob, 'number');
    assert.ok(t.logprob <= 0);
    assert.ok(Array.isArray(t.bytes) || t.bytes === null);
    if (t.bytes) {
      assert.ok(t.bytes.every((x) => Number.isInteger(x) && x >= 0 && x < 256));
      assert.equal(Buffer.from(t.bytes).toString('utf8'), t.token);
    }
    assert.equal(t.top_logprobs.length, 3);
    for (let i = 0; i < 3; ++i) {
      const tl = t.top_logprobs[i];
      assert.equal(typeof tl.token, 'string');
      assert.ok(tl.logprob <= 0);
      if (i) assert.ok(tl.logprob <= t.top_logprobs[i - 1].logprob, 'descending');
    }
    // Greedy: the chosen token is the best one.
    assert.equal(t.token, t.top_logprobs[0].token);
    assert.ok(Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5);
  }
  assert.equal(content.map((t) => t.token).join(''), r.choices[0].message.content);

  // Streamed: each chunk carries the logprobs of its tokens.
  const chunks = await collectChatStream({ model: MODEL, messages: [{ role: 'user', content: 'def f(x):' }], max_tokens: 8,
    temperature: 0, logprobs: true, top_logprobs: 2 });
  const streamed = chunks.flatMap((c) => c.choices[0]?.logprobs?.content ?? []);
  assert.deepEqual(streamed.map((t) => t.token), content.map((t) => t.token));
  for (const t of streamed) assert.equal(t.top_logprobs.length, 2);

  const c = await client.completions.create({ model: MODEL, prompt: 'def f(x):', max_tokens: 8, temperature: 0, logprobs: 2 });
  const lp = c.choices[0].logprobs;
  assert.equal(lp.tokens.length, lp.token_logprobs.length);
  assert.equal(lp.tokens.length, lp.top_logprobs.length);
  assert.equal(lp.tokens.length, lp.text_offset.length);
  assert.equal(lp.tokens.join(''), c.choices[0].text);
  for (let i = 0; i < lp.tokens.length; ++i) {
    assert.ok(lp.token_logprobs[i] <= 0);
    const top = lp.top_logprobs[i];
    assert.equal(Object.keys(top).length <= 2, true);
    assert.ok(lp.tokens[i] in top, 'greedy token among the top');
  }
  assert.equal(lp.text_offset[0], 0);

  // Without logprobs: null.
  const n = await client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], max_tokens: 2, temperature: 0 });
  assert.ok(n.choices[0].logprobs == null);
});

test('logit_bias, penalties and the other sampling fields are honoured', T, async () => {
  // Token ids of a golden output; bias one of them to +100 so greedy repeats it.
  const g = golden.cases[0];
  const tok = g.output_ids[1];
  const r = await client.completions.create({ model: MODEL, prompt: g.text, max_tokens: 6, temperature: 0,
    logit_bias: { [tok]: 100 }, logprobs: 1 });
  const toks = r.choices[0].logprobs.tokens;
  assert.equal(toks.length, 6);
  assert.equal(new Set(toks).size, 1, `all tokens the biased one: ${JSON.stringify(toks)}`);
  // -100 bans it: the golden output's first token disappears.
  const first = g.output_ids[0];
  const banned = await client.completions.create({ model: MODEL, prompt: g.prompt_ids, max_tokens: 4, temperature: 0,
    logit_bias: { [first]: -100 }, logprobs: 1 });
  const unbanned = await client.completions.create({ model: MODEL, prompt: g.prompt_ids, max_tokens: 4, temperature: 0, logprobs: 1 });
  assert.notEqual(banned.choices[0].logprobs.tokens[0], unbanned.choices[0].logprobs.tokens[0]);

  // A strong repetition/frequency penalty changes the repetitive greedy output of fibonacci.
  const plain = await client.completions.create({ model: MODEL, prompt: 'def fibonacci(n):', max_tokens: 32, temperature: 0 });
  const pen = await client.completions.create({ model: MODEL, prompt: 'def fibonacci(n):', max_tokens: 32, temperature: 0,
    frequency_penalty: 2.0, presence_penalty: 1.0 });
  assert.notEqual(pen.choices[0].text, plain.choices[0].text);
  const rep = await client.completions.create({ model: MODEL, prompt: 'def fibonacci(n):', max_tokens: 32, temperature: 0,
    repetition_penalty: 1.5 });
  assert.notEqual(rep.choices[0].text, plain.choices[0].text);
});

test('prefix cache: a repeated long prompt reports cached_tokens > 0 and gives the same greedy text', T, async () => {
  const prompt = longPrompt(14, `cache-${process.pid}`);
  const a = await client.completions.create({ model: MODEL, prompt, max_tokens: 16, temperature: 0 });
  assert.ok(a.usage.prompt_tokens > 200, `long prompt: ${a.usage.prompt_tokens} tokens`);
  const cachedA = a.usage.prompt_tokens_details?.cached_tokens ?? 0;
  assert.ok(cachedA < a.usage.prompt_tokens / 2, `first request mostly uncached (${cachedA})`);
  const b = await client.completions.create({ model: MODEL, prompt, max_tokens: 16, temperature: 0 });
  const cachedB = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cachedB > 0, 'cached_tokens > 0 on the repeat');
  assert.ok(cachedB >= a.usage.prompt_tokens - 32 && cachedB < a.usage.prompt_tokens,
    `nearly the whole prompt is cached (${cachedB} of ${a.usage.prompt_tokens})`);
  assert.equal(b.choices[0].text, a.choices[0].text);

  // Chat: a shared system prompt + different user turns reuses the common prefix.
  const system = longPrompt(10, `sys-${process.pid}`);
  const c1 = await client.chat.completions.create({ model: MODEL, max_tokens: 8, temperature: 0,
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'first question' }] });
  const c2 = await client.chat.completions.create({ model: MODEL, max_tokens: 8, temperature: 0,
    messages: [{ role: 'system', content: system }, { role: 'user', content: 'second question' }], stream: false });
  assert.ok(c2.usage.prompt_tokens_details.cached_tokens >= 128, `shared system prompt cached: ${JSON.stringify(c2.usage)}`);
  assert.ok(c1.usage.prompt_tokens > 150);

  // Streamed usage carries cached_tokens too.
  const chunks = await collectCompletionStream({ model: MODEL, prompt, max_tokens: 4, temperature: 0, stream_options: { include_usage: true } });
  assert.ok(chunks.at(-1).usage.prompt_tokens_details.cached_tokens > 0);
});

test('/metrics: Prometheus text with the documented families; idle after requests', T, async () => {
  await client.completions.create({ model: MODEL, prompt: 'x = 1', max_tokens: 2, temperature: 0 });
  const r = await curl(server, '/metrics');
  assert.equal(r.status, 200);
  assert.match(r.body, /^# (HELP|TYPE) /m);
  const names = new Set(r.body.split('\n').filter((l) => l && !l.startsWith('#')).map((l) => l.split(/[{\s]/)[0]));
  const has = (re) => [...names].some((n) => re.test(n));
  assert.ok(has(/request/), 'requests counter');
  assert.ok(has(/prompt_tokens/), 'prompt tokens');
  assert.ok(has(/(generat|completion)\w*tokens/), 'generated tokens');
  assert.ok(has(/(time_to_first_token|ttft)\w*_bucket/), 'TTFT histogram');
  assert.ok(has(/(inter_token|itl|time_per_output_token)\w*_bucket/), 'ITL histogram');
  assert.ok(has(/(prefix|cache)\w*(hit|rate)/) || has(/cached/), 'prefix-cache hit rate');
  assert.ok(has(/free/), 'KV blocks free');
  const idle = await waitIdle(server);
  assert.equal(idle.running, 0);
  assert.equal(idle.kvUsed, 0);
});

test('--no-prefix-cache: a repeated prompt reports cached_tokens 0 and the same text', T, async () => {
  const s = await new Server({ args: ['--no-prefix-cache'] }).start();
  try {
    const OpenAI = await loadOpenAI();
    const c = new OpenAI({ apiKey: 'x', baseURL: s.baseURL, maxRetries: 0 });
    const prompt = longPrompt(10, 'nocache');
    const a = await c.completions.create({ model: MODEL, prompt, max_tokens: 12, temperature: 0 });
    const b = await c.completions.create({ model: MODEL, prompt, max_tokens: 12, temperature: 0 });
    assert.equal(b.usage.prompt_tokens_details?.cached_tokens ?? 0, 0);
    assert.equal(b.choices[0].text, a.choices[0].text);
    // The same text as the caching server gives.
    const cached = await client.completions.create({ model: MODEL, prompt, max_tokens: 12, temperature: 0 });
    assert.equal(cached.choices[0].text, a.choices[0].text);
  } finally {
    const r = await s.stop();
    assert.equal(r.code, 0);
  }
});
