// End-to-end: SIGTERM. The server stops accepting (new requests: 503 or refused connection),
// finishes or cancels its running streams, and exits 0; no stream hangs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { Server, assertErrorShape, sleep, withTimeout, curl, ms, SANITIZED, CODE_PROMPTS } from './lib/harness.mjs';

let MODEL;
async function start() {
  const server = await new Server().start();
  MODEL ??= (await curl(server, '/v1/models')).json.data[0].id;
  return server;
}

// Opens a streaming completion with raw HTTP; resolves once `minEvents` data events arrived.
// result: a promise of { outcome: 'complete' | 'cancelled' | 'closed' | 'error', events, finish }.
function openStream(server, body, minEvents, agent) {
  return new Promise((resolveStarted, rejectStarted) => {
    let resolveResult;
    const result = new Promise((r) => { resolveResult = r; });
    const payload = JSON.stringify({ model: MODEL, ...body, stream: true });
    const req = http.request({ host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/completions', agent: agent ?? false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      if (res.statusCode !== 200) {
        rejectStarted(new Error(`HTTP ${res.statusCode}`));
        return;
      }
      let buf = '';
      let events = 0;
      let done = false;
      let finish = null;
      let errorFrame = null;
      let started = false;
      // complete: finish chunk + [DONE]; cancelled: error frame + [DONE] (the server cancelled it);
      // closed: the connection ended without [DONE].
      const outcome = () => (done ? (errorFrame ? 'cancelled' : 'complete') : 'closed');
      res.on('data', (d) => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data:')).map((l) => l.slice(5).trim()).join('');
          if (!data) continue;
          if (data === '[DONE]') { done = true; continue; }
          ++events;
          try {
            const j = JSON.parse(data);
            if (j.choices?.[0]?.finish_reason) finish = j.choices[0].finish_reason;
            if (j.error) errorFrame = j.error;
          } catch { /* counted anyway */ }
          if (!started && events >= minEvents) { started = true; resolveStarted({ result, req }); }
        }
      });
      res.on('end', () => resolveResult({ outcome: outcome(), events, finish, errorFrame }));
      res.on('error', (e) => resolveResult({ outcome: 'error', events, finish, error: e.message }));
      res.on('close', () => resolveResult({ outcome: outcome(), events, finish, errorFrame }));
    });
    req.on('error', (e) => { rejectStarted(e); resolveResult({ outcome: 'error', events: 0, error: e.message }); });
    req.write(payload);
    req.end();
  });
}

function tryRequest(port, agent, body = { model: MODEL, prompt: 'x', max_tokens: 2 }) {
  return new Promise((resolve) => {
    const payload = JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, method: 'POST', path: '/v1/completions', agent: agent ?? false, timeout: 10_000,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      let body = '';
      res.on('data', (d) => { body += d; });
      res.on('end', () => resolve({ status: res.statusCode, body }));
      res.on('error', (e) => resolve({ error: e.code ?? e.message }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', (e) => resolve({ error: e.code ?? e.message }));
    req.end(payload);
  });
}

test('SIGTERM while streams run: streams end, new requests refused, exit 0, no hang', { timeout: ms(90_000) }, async (t) => {
  const server = await start();
  const keepAlive = new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    // A keep-alive connection opened before the signal, to see a 503 on it afterwards.
    const warm = await tryRequest(server.port, keepAlive);
    assert.equal(warm.status, 200);
    const streams = [];
    for (let i = 0; i < 6; ++i) {
      const prompt = i === 0 ? 'def fibonacci(n):' : CODE_PROMPTS[i];
      streams.push(await openStream(server, { prompt, max_tokens: SANITIZED ? 40 : 400, temperature: 0 }, 3));
    }
    const t0 = Date.now();
    server.child.kill('SIGTERM');
    await sleep(50);
    const fresh = await tryRequest(server.port);
    const reused = await tryRequest(server.port, keepAlive);
    for (const [what, r] of [['new connection', fresh], ['keep-alive connection', reused]]) {
      if (r.status !== undefined) {
        assert.equal(r.status, 503, `${what} after SIGTERM: HTTP ${r.status} ${r.body}`);
        assertErrorShape(assert, r.body, r.status, `${what} 503`);
      }
      t.diagnostic(`${what} after SIGTERM: ${r.status ?? r.error}`);
    }
    const outcomes = await withTimeout(Promise.all(streams.map((s) => s.result)), 30_000, 'streams ending after SIGTERM');
    const exit = await withTimeout(server.exited, 30_000, 'process exit after SIGTERM');
    t.diagnostic(`exit ${JSON.stringify(exit)} after ${Date.now() - t0} ms; streams: ${JSON.stringify(outcomes)}`);
    assert.equal(exit.code, 0, `exit code (signal ${exit.signal})\n${server.output}`);
    for (const o of outcomes) {
      assert.ok(['complete', 'cancelled', 'closed', 'error'].includes(o.outcome), JSON.stringify(o));
      if (o.outcome === 'complete') assert.ok(o.finish, 'a completed stream has a finish chunk');
      if (o.outcome === 'cancelled') assertErrorShape(assert, { error: o.errorFrame }, 200, 'error frame of a cancelled stream');
    }
  } finally {
    keepAlive.destroy();
    if (server.exitCode === undefined) await server.stop(1000);
  }
});

test('SIGTERM when idle: exit 0 promptly', { timeout: ms(30_000) }, async () => {
  const server = await start();
  const r = await server.stop(10_000);
  assert.equal(r.graceful, true, 'exited without SIGKILL');
  assert.equal(r.code, 0);
  assert.ok(r.ms < ms(5_000), `exit took ${r.ms} ms`);
});

test('SIGTERM while a client is mid-request (non-streaming) and another is sending its body', { timeout: ms(60_000) }, async (t) => {
  const server = await start();
  try {
    const long = { model: MODEL, prompt: 'def fibonacci(n):', max_tokens: 200, temperature: 0 };
    const payload = JSON.stringify(long);
    const pending = tryRequest(server.port);  // a short one, may or may not complete
    // A request whose body is only half sent when the signal comes.
    const half = new Promise((resolve) => {
      const req = http.request({ host: '127.0.0.1', port: server.port, method: 'POST', path: '/v1/completions', agent: false,
        headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode }));
      });
      req.on('error', (e) => resolve({ error: e.code }));
      req.write(payload.slice(0, 10));
      setTimeout(() => { try { req.end(payload.slice(10)); } catch { /* closed */ } }, 1500);
    });
    const nonStream = tryRequest(server.port, undefined, long);
    await sleep(200);
    server.child.kill('SIGTERM');
    const exit = await withTimeout(server.exited, 30_000, 'process exit');
    assert.equal(exit.code, 0, server.output);
    const rs = await withTimeout(Promise.all([pending, half, nonStream]), 15_000, 'clients ending');
    t.diagnostic(JSON.stringify(rs));
    for (const r of rs) if (r.status !== undefined) assert.ok([200, 503].includes(r.status), JSON.stringify(r));
  } finally {
    if (server.exitCode === undefined) await server.stop(1000);
  }
});

test('SIGTERM with a short --shutdown-grace cancels long streams (error frame + [DONE]) and exits 0', { timeout: ms(60_000) }, async (t) => {
  const server = await new Server({ args: ['--shutdown-grace', '1'] }).start();
  MODEL ??= (await curl(server, '/v1/models')).json.data[0].id;
  try {
    // 8 x 2,000 tokens: far more than even a fast machine decodes in the 1 s grace.
    const streams = [];
    for (let i = 0; i < 8; ++i) {
      streams.push(await openStream(server, { prompt: `def fibonacci_${i}(n):`, max_tokens: 2000, temperature: 0, ignore_eos: true }, 2));
    }
    const t0 = Date.now();
    server.child.kill('SIGTERM');
    const outcomes = await withTimeout(Promise.all(streams.map((s) => s.result)), 20_000, 'streams ending');
    const exit = await withTimeout(server.exited, 20_000, 'process exit');
    t.diagnostic(`exit after ${Date.now() - t0} ms: ${JSON.stringify(outcomes)}`);
    assert.equal(exit.code, 0, server.output);
    for (const o of outcomes) {
      assert.ok(o.outcome === 'cancelled' || o.outcome === 'closed', `a 2000-token stream cannot finish in 1 s: ${JSON.stringify(o)}`);
      if (o.outcome === 'cancelled') assertErrorShape(assert, { error: o.errorFrame }, 200, 'error frame');
    }
  } finally {
    if (server.exitCode === undefined) await server.stop(1000);
  }
});

test('a second SIGTERM cancels at once', { timeout: ms(60_000) }, async () => {
  const server = await start();
  try {
    const streams = [];
    for (let i = 0; i < 6; ++i) {
      streams.push(await openStream(server, { prompt: `def fibonacci_${i}(n):`, max_tokens: 2000, temperature: 0, ignore_eos: true }, 2));
    }
    const t0 = Date.now();
    server.child.kill('SIGTERM');
    await sleep(300);
    server.child.kill('SIGTERM');
    const exit = await withTimeout(server.exited, 8_000, 'process exit after the second SIGTERM');
    assert.equal(exit.code, 0, server.output);
    assert.ok(Date.now() - t0 < ms(8_000));
    const outcomes = await withTimeout(Promise.all(streams.map((s) => s.result)), 5_000, 'streams ending');
    for (const o of outcomes) assert.ok(['cancelled', 'closed'].includes(o.outcome), JSON.stringify(o));
  } finally {
    if (server.exitCode === undefined) await server.stop(1000);
  }
});
