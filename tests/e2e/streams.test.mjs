// End-to-end: streams under load and clients that go away.
// - a client that disconnects mid-stream (AbortController, killed curl, abort before the first
//   token) frees its sequence: /metrics returns to 0 running sequences and 0 used KV blocks;
// - 32 concurrent greedy streams produce exactly their solo outputs, and really run batched.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import {
  Server, loadOpenAI, metricValue, waitIdle, sleep, withTimeout, CODE_PROMPTS, longPrompt,
  ms, SANITIZED,
} from './lib/harness.mjs';

let server;
let client;
let MODEL;

before(async () => {
  server = await new Server({ args: ['--max-num-seqs', '64'] }).start();
  const OpenAI = await loadOpenAI();
  client = new OpenAI({ apiKey: 'unused', baseURL: server.baseURL, maxRetries: 0, timeout: ms(120_000) });
  MODEL = (await client.models.list()).data[0].id;
});

after(async () => {
  const r = await server?.stop();
  assert.equal(r?.code, 0, `kestrel serve exit: ${JSON.stringify(r)}\n${server?.output}`);
});

// Greedy 'def fibonacci(n):' repeats ", 0" for thousands of tokens: a stream that never ends early.
const ENDLESS = 'def fibonacci(n):';

// kestrel_requests_finished_total{finish_reason="cancelled"} (docs/server.md).
function cancelledCount(samples) {
  const hits = samples.filter((x) => /finished/.test(x.name) && x.labels.finish_reason === 'cancelled');
  assert.ok(hits.length, `no cancelled counter in /metrics:\n${samples.text}`);
  return hits.reduce((a, x) => a + x.value, 0);
}

async function readChunks(iter, n) {
  const got = [];
  for (let i = 0; i < n; ++i) {
    const { value, done } = await iter.next();
    if (done) break;
    got.push(value);
  }
  return got;
}

test('client abort mid-stream (AbortController) frees the sequence', { timeout: ms(60_000) }, async () => {
  for (const kind of ['completions', 'chat']) {
    const ac = new AbortController();
    const params = { model: MODEL, max_tokens: 1500, temperature: 0, stream: true };
    const stream = kind === 'chat'
      ? await client.chat.completions.create({ ...params, messages: [{ role: 'user', content: ENDLESS }] }, { signal: ac.signal })
      : await client.completions.create({ ...params, prompt: ENDLESS }, { signal: ac.signal });
    const it = stream[Symbol.asyncIterator]();
    const got = await readChunks(it, 8);
    assert.equal(got.length, 8, 'the stream is running');
    const during = await server.metrics();
    assert.equal(metricValue(during, 'running'), 1, 'one running sequence while streaming');
    assert.ok(metricValue(during, 'kvUsed') > 0, 'it holds KV blocks');
    const cancelledBefore = cancelledCount(during);
    ac.abort();
    // The SDK ends the iteration quietly on an abort (or rejects with an AbortError).
    // Chunks already buffered may still come out first.
    let end;
    for (let i = 0; i < 10_000; ++i) {
      end = await it.next().then((r) => r, (e) => e);
      if (end.done !== false) break;
    }
    assert.ok(end.done === true || end.name === 'AbortError' || /abort/i.test(end.message ?? ''), `after abort: ${JSON.stringify(end)}`);
    const idle = await waitIdle(server, 10_000);
    assert.equal(idle.running, 0);
    assert.equal(idle.kvUsed, 0);
    assert.equal(cancelledCount(await server.metrics()), cancelledBefore + 1, 'counted as cancelled');
  }
});

test('curl killed mid-stream frees the sequence', { timeout: ms(60_000) }, async () => {
  const body = JSON.stringify({ model: MODEL, prompt: ENDLESS, max_tokens: 1500, temperature: 0, stream: true });
  const child = spawn('curl', ['-sS', '-N', '-H', 'Content-Type: application/json', '--data-binary', body, `${server.baseURL}/completions`]);
  let out = '';
  await withTimeout(new Promise((resolve) => {
    child.stdout.on('data', (d) => { out += d; if ((out.match(/^data: /gm) ?? []).length >= 6) resolve(); });
  }), 20_000, 'curl stream start');
  assert.equal(metricValue(await server.metrics(), 'running'), 1);
  child.kill('SIGKILL');
  const idle = await waitIdle(server, 10_000);
  assert.equal(idle.kvUsed, 0);
});

test('abort before the first token (during a long prefill) frees everything', { timeout: ms(60_000) }, async () => {
  for (const delay of [0, 5, 20, 60]) {
    const ac = new AbortController();
    // ~1,660 prompt tokens: a prefill of several steps (2048-token budget shared with others).
    const p = client.completions.create({ model: MODEL, prompt: longPrompt(SANITIZED ? 4 : 40, `abort-${delay}`), max_tokens: 300, temperature: 0, stream: true },
      { signal: ac.signal }).then(async (s) => { let n = 0; for await (const _ of s) ++n; return n; }).then((n) => ({ n }), (e) => ({ e }));
    await sleep(delay);
    ac.abort();
    const r = await p;
    assert.ok(r.e ? r.e.name === 'APIUserAbortError' || /abort/i.test(r.e.message) : r.n < 300, `aborted: ${JSON.stringify(r)} ${r.e}`);
  }
  const idle = await waitIdle(server, 10_000);
  assert.equal(idle.kvUsed, 0);
});

test('a non-streaming client that disconnects leaves no sequence behind', { timeout: ms(60_000) }, async () => {
  const ac = new AbortController();
  const p = client.completions.create({ model: MODEL, prompt: ENDLESS, max_tokens: 300, temperature: 0 }, { signal: ac.signal });
  await sleep(300);
  ac.abort();
  await assert.rejects(p);
  // The server may notice the closed socket (cancel) or finish the 300 tokens; either way it ends.
  const idle = await waitIdle(server, 40_000);
  assert.equal(idle.kvUsed, 0);
});

test(`${SANITIZED ? 8 : 32} concurrent greedy streams equal their solo outputs`, { timeout: ms(120_000) }, async (t) => {
  const N = SANITIZED ? 8 : 32;
  const MAX = SANITIZED ? 8 : 32;
  // Short prompts, and every 8th a long one (~250-650 tokens) whose prefill chunks share steps
  // with the others' decodes.
  const reqs = Array.from({ length: N }, (_, i) => {
    const code = CODE_PROMPTS[i % CODE_PROMPTS.length];
    let variant = i < CODE_PROMPTS.length ? code : `# variant ${i}\n${code}`;
    if (i % 8 === 5 && !SANITIZED) variant = `${longPrompt(6 + i / 2, `batch-${i}`)}${code}`;
    if (i % 4 === 3) return { kind: 'chat', messages: [{ role: 'user', content: `Complete this code:\n${variant}` }] };
    return { kind: 'completions', prompt: variant };
  });
  async function run(r) {
    const common = { model: MODEL, max_tokens: MAX, temperature: 0, stream: true, stream_options: { include_usage: true } };
    const stream = r.kind === 'chat'
      ? await client.chat.completions.create({ ...common, messages: r.messages })
      : await client.completions.create({ ...common, prompt: r.prompt });
    let text = '';
    let finish = null;
    let usage = null;
    for await (const c of stream) {
      if (c.usage) usage = c.usage;
      const ch = c.choices[0];
      if (!ch) continue;
      text += (r.kind === 'chat' ? ch.delta?.content : ch.text) ?? '';
      if (ch.finish_reason) finish = ch.finish_reason;
    }
    return { text, finish, tokens: usage?.completion_tokens };
  }
  const solo = [];
  for (const r of reqs) solo.push(await run(r));
  await waitIdle(server);

  let maxRunning = 0;
  let polling = true;
  const poller = (async () => {
    while (polling) {
      try { maxRunning = Math.max(maxRunning, metricValue(await server.metrics(), 'running')); } catch { /* next */ }
      await sleep(25);
    }
  })();
  const t0 = Date.now();
  const together = await Promise.all(reqs.map(run));
  const ms = Date.now() - t0;
  polling = false;
  await poller;
  t.diagnostic(`32 streams in ${ms} ms; max running sequences seen: ${maxRunning}`);
  for (let i = 0; i < N; ++i) {
    assert.deepEqual(together[i], solo[i], `stream ${i} (${reqs[i].kind}) differs from its solo run`);
  }
  assert.ok(maxRunning >= Math.min(8, N), `streams ran batched (max running ${maxRunning})`);
  const idle = await waitIdle(server);
  assert.equal(idle.kvUsed, 0);
});

test('aborting queued requests (max-num-seqs 2) empties the queue; then idle', { timeout: ms(60_000) }, async () => {
  const small = await new Server({ args: ['--max-num-seqs', '2'] }).start();
  const OpenAI = await loadOpenAI();
  const c = new OpenAI({ apiKey: 'x', baseURL: small.baseURL, maxRetries: 0, timeout: ms(60_000) });
  try {
    const running = [];
    for (let i = 0; i < 2; ++i) {
      const ac = new AbortController();
      const st = await c.completions.create({ model: MODEL, prompt: ENDLESS, max_tokens: 1500, temperature: 0, stream: true }, { signal: ac.signal });
      const it = st[Symbol.asyncIterator]();
      await readChunks(it, 2);
      running.push({ ac, it });
    }
    // Three more: queued behind the two running ones (their response headers may not come yet).
    const queued = Array.from({ length: 3 }, () => {
      const ac = new AbortController();
      const p = c.completions.create({ model: MODEL, prompt: ENDLESS, max_tokens: 50, temperature: 0, stream: true }, { signal: ac.signal })
        .then(async (st) => { for await (const _ of st) { /* drain */ } }).catch(() => {});
      return { ac, p };
    });
    let m;
    for (let i = 0; i < 100; ++i) {
      m = await small.metrics();
      if (metricValue(m, 'waiting') === 3) break;
      await sleep(50);
    }
    assert.equal(metricValue(m, 'waiting'), 3, 'three queued');
    assert.equal(metricValue(m, 'running'), 2, 'two running');
    for (const q of queued) q.ac.abort();
    await Promise.all(queued.map((q) => q.p));
    for (let i = 0; i < 100; ++i) {
      m = await small.metrics();
      if (metricValue(m, 'waiting') === 0) break;
      await sleep(50);
    }
    assert.equal(metricValue(m, 'waiting'), 0, 'aborted queued requests leave the queue');
    assert.equal(metricValue(m, 'running'), 2, 'the running ones go on');
    for (const r of running) r.ac.abort();
    const idle = await waitIdle(small, 10_000);
    assert.equal(idle.kvUsed, 0);
  } finally {
    const r = await small.stop();
    assert.equal(r.code, 0);
  }
});
