// Shared harness of the end-to-end tests: starts the real `kestrel serve` on a free port, talks to
// it with curl (child_process) and raw HTTP, reads /metrics, and stops it.
//
// Environment (set by tests/e2e/CMakeLists.txt; defaults work from the repository root):
//   KESTREL_BINARY      path of the built `kestrel` (default: build-e2e/kestrel, then build/release/kestrel)
//   KESTREL_MODEL       model directory (default: models/kestrel-tiny)
//   KESTREL_E2E_THREADS --threads of the server (default: the server's own default)
//   KESTREL_E2E_VERBOSE=1 echoes the server's stderr/stdout
import { spawn, execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

export { sleep };

export const REPO_ROOT = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../..');

export function kestrelBinary() {
  if (process.env.KESTREL_BINARY) return process.env.KESTREL_BINARY;
  for (const p of ['build-e2e/kestrel', 'build/release/kestrel', 'build/kestrel']) {
    const abs = path.join(REPO_ROOT, p);
    if (existsSync(abs)) return abs;
  }
  throw new Error('kestrel binary not found: set KESTREL_BINARY');
}

// Sanitizer builds (the debug preset) run the model ~40x slower: time bounds stretch by
// KESTREL_E2E_TIME_FACTOR (default 10 there, 1 otherwise) and heavy workloads shrink (SANITIZED).
function detectSanitized() {
  try {
    return /__asan_init|__tsan_init|__msan_init/.test(readFileSync(kestrelBinary(), 'latin1'));
  } catch {
    return false;
  }
}
export const SANITIZED = detectSanitized();
export const TIME_FACTOR = Number(process.env.KESTREL_E2E_TIME_FACTOR ?? (SANITIZED ? 10 : 1));
export const ms = (x) => x * TIME_FACTOR;

export function modelDir() {
  return process.env.KESTREL_MODEL || path.join(REPO_ROOT, 'models/kestrel-tiny');
}

// The official openai SDK, installed by scripts/setup.sh into tests/e2e/node_modules.
export async function loadOpenAI() {
  try {
    return (await import('openai')).default;
  } catch (e) {
    throw new Error(`the openai npm package is missing (run scripts/setup.sh, or npm ci in tests/e2e): ${e.message}`);
  }
}

export async function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.unref();
    srv.on('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const live = new Set();
function killAll() {
  for (const child of live) {
    try { child.kill('SIGKILL'); } catch { /* gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => { killAll(); process.exit(130); });
}

// A running `kestrel serve`. start() resolves once it printed its http://HOST:PORT/v1 line and
// answers GET /health.
export class Server {
  constructor({ args = [], readyTimeoutMs = 60_000 } = {}) {
    this.extraArgs = args;
    this.readyTimeoutMs = readyTimeoutMs;
    this.output = '';
    this.exitCode = undefined;
    this.exitSignal = undefined;
  }

  get baseURL() { return `http://127.0.0.1:${this.port}/v1`; }
  get origin() { return `http://127.0.0.1:${this.port}`; }
  get pid() { return this.child.pid; }

  async start() {
    const port = await freePort();
    const args = ['serve', '--model', modelDir(), '--host', '127.0.0.1', '--port', String(port)];
    if (process.env.KESTREL_E2E_THREADS) args.push('--threads', process.env.KESTREL_E2E_THREADS);
    args.push(...this.extraArgs);
    this.port = port;
    const env = { ...process.env };
    delete env.KESTREL_API_KEY;  // the server's default --api-key
    this.child = spawn(kestrelBinary(), args, { cwd: REPO_ROOT, env, stdio: ['ignore', 'pipe', 'pipe'] });
    live.add(this.child);
    this.exited = new Promise((resolve) => {
      this.child.on('exit', (code, signal) => {
        this.exitCode = code;
        this.exitSignal = signal;
        live.delete(this.child);
        resolve({ code, signal });
      });
    });
    const ready = new Promise((resolve, reject) => {
      const onData = (buf) => {
        const s = buf.toString();
        this.output += s;
        if (process.env.KESTREL_E2E_VERBOSE) process.stderr.write(`[kestrel] ${s}`);
        const m = this.output.match(/http:\/\/[^\s/]+:(\d+)\/v1/);
        if (m) {
          this.port = Number(m[1]);
          resolve();
        }
      };
      this.child.stdout.on('data', onData);
      this.child.stderr.on('data', onData);
      this.child.on('error', reject);
      this.exited.then(({ code, signal }) =>
        reject(new Error(`kestrel serve exited before it was ready (code ${code}, signal ${signal}):\n${this.output}`)));
    });
    let timer;
    const timeout = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`kestrel serve not ready after ${this.readyTimeoutMs} ms:\n${this.output}`)),
        this.readyTimeoutMs);
    });
    try {
      await Promise.race([ready, timeout]);
      // The ready line should mean it listens; tolerate a short gap anyway.
      for (let i = 0; ; ++i) {
        try {
          const r = await httpRequest(this, 'GET', '/health');
          if (r.status === 200) break;
        } catch (e) {
          if (i > 50) throw e;
        }
        await sleep(100);
      }
    } catch (e) {
      this.child.kill('SIGKILL');
      throw e;
    } finally {
      clearTimeout(timer);
    }
    return this;
  }

  // SIGTERM, then SIGKILL after graceMs. Resolves with { code, signal, graceful }.
  async stop(graceMs = 20_000) {
    graceMs = ms(graceMs);
    if (!this.child || this.exitCode !== undefined || this.exitSignal !== undefined) {
      return { code: this.exitCode, signal: this.exitSignal, graceful: true };
    }
    this.child.kill('SIGTERM');
    const t0 = Date.now();
    const ac = new AbortController();
    const res = await Promise.race([this.exited, sleep(graceMs, null, { signal: ac.signal }).catch(() => null)]);
    ac.abort();  // no timer left to keep the test process alive
    if (res) return { ...res, graceful: true, ms: Date.now() - t0 };
    this.child.kill('SIGKILL');
    const r2 = await this.exited;
    return { ...r2, graceful: false, ms: Date.now() - t0 };
  }

  rssKiB() {
    const status = readFileSync(`/proc/${this.child.pid}/status`, 'utf8');
    const m = status.match(/^VmRSS:\s+(\d+)\s+kB/m);
    return m ? Number(m[1]) : NaN;
  }

  async metrics() {
    const r = await httpRequest(this, 'GET', '/metrics');
    if (r.status !== 200) throw new Error(`GET /metrics: ${r.status} ${r.body}`);
    return parseMetrics(r.body);
  }
}

// Raw HTTP with node:http (no fetch pooling surprises). body: string | Buffer | object (JSON).
export function httpRequest(server, method, urlPath, { body, headers = {}, timeoutMs = 30_000 } = {}) {
  return new Promise((resolve, reject) => {
    let payload = body;
    const h = { ...headers };
    if (payload !== undefined && typeof payload !== 'string' && !Buffer.isBuffer(payload)) {
      payload = JSON.stringify(payload);
      h['content-type'] ??= 'application/json';
    }
    if (payload !== undefined) h['content-length'] = Buffer.byteLength(payload);
    const req = http.request({ host: '127.0.0.1', port: server.port, method, path: urlPath, headers: h,
      agent: false, timeout: timeoutMs }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks).toString() }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error(`${method} ${urlPath}: timed out after ${timeoutMs} ms`)));
    req.on('error', reject);
    if (payload !== undefined) req.write(payload);
    req.end();
  });
}

// curl, as a user would run it. Returns { status, body, contentType, json (when the body parses) }.
export function curl(server, urlPath, { method, json, data, dataFile, headers = {}, extra = [], timeoutS = 60 } = {}) {
  const args = ['-sS', '-N', '--max-time', String(timeoutS), '-o', '-', '-w', '\n%{content_type}\n%{http_code}'];
  if (method) args.push('-X', method);
  for (const [k, v] of Object.entries(headers)) args.push('-H', `${k}: ${v}`);
  if (json !== undefined) {
    args.push('-H', 'Content-Type: application/json', '--data-binary', JSON.stringify(json));
  } else if (data !== undefined) {
    args.push('-H', 'Content-Type: application/json', '--data-binary', data);
  } else if (dataFile !== undefined) {
    args.push('-H', 'Content-Type: application/json', '--data-binary', `@${dataFile}`);
  }
  args.push(...extra, `${server.origin}${urlPath}`);
  return new Promise((resolve, reject) => {
    execFile('curl', args, { maxBuffer: 64 << 20, encoding: 'buffer' }, (err, stdout, stderr) => {
      const out = stdout.toString();
      const nl = out.lastIndexOf('\n');
      const status = Number(out.slice(nl + 1));
      const nl2 = out.lastIndexOf('\n', nl - 1);
      const contentType = out.slice(nl2 + 1, nl);
      const body = out.slice(0, nl2);
      if (err && !status) return reject(new Error(`curl ${urlPath}: ${err.message} ${stderr}`));
      let parsed;
      try { parsed = JSON.parse(body); } catch { /* not JSON (SSE, text) */ }
      resolve({ status, body, contentType, json: parsed, curlError: err ? stderr.toString() : undefined });
    });
  });
}

// Server-sent events of an OpenAI stream body: the JSON payloads, and whether [DONE] came last.
export function parseSSE(text) {
  const events = [];
  let done = false;
  let afterDone = 0;
  for (const block of text.split(/\r?\n\r?\n/)) {
    const lines = block.split(/\r?\n/).filter((l) => l.startsWith('data:'));
    if (!lines.length) continue;
    const data = lines.map((l) => l.slice(5).replace(/^ /, '')).join('\n');
    if (done) ++afterDone;
    if (data === '[DONE]') { done = true; continue; }
    events.push(JSON.parse(data));
  }
  return { events, done, afterDone };
}

// Prometheus text format → [{ name, labels: {k: v}, value }].
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const kv of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[kv[1]] = kv[2];
    samples.push({ name: m[1], labels, value: Number(m[4]) });
  }
  samples.text = text;
  return samples;
}

// Metric names chosen by the HTTP layer (docs/server.md). Each entry lists exact names first, then
// a tolerant predicate on "name{labels}" so a rename does not silently pass: the value must exist.
const METRIC_MATCHERS = {
  running: {
    exact: ['kestrel_num_requests_running', 'kestrel_running_sequences', 'kestrel_requests_running'],
    loose: (s) => /running/.test(s) && !/(_bucket|_sum|_count|_total)\b/.test(s),
  },
  waiting: {
    exact: ['kestrel_num_requests_waiting', 'kestrel_queue_length', 'kestrel_requests_waiting'],
    loose: (s) => /(waiting|queue)/.test(s) && !/(_bucket|_sum|_count|_total)\b/.test(s),
  },
  kvUsed: {
    exact: ['kestrel_kv_blocks_used'],
    loose: (s) => /(kv|block)/.test(s) && /used/.test(s) && !/(_bucket|_sum|_count|_total|perc|ratio|usage)/.test(s),
  },
  kvFree: {
    exact: ['kestrel_kv_blocks_free'],
    loose: (s) => /(kv|block)/.test(s) && /free/.test(s) && !/(_bucket|_sum|_count|_total|cached)/.test(s),
  },
};

function sampleKey(s) {
  const lbl = Object.entries(s.labels).map(([k, v]) => `${k}="${v}"`).join(',');
  return lbl ? `${s.name}{${lbl}}` : s.name;
}

// The value of one gauge (summed over its label sets). Throws when no metric matches.
export function metricValue(samples, what) {
  const m = METRIC_MATCHERS[what];
  let hits = samples.filter((s) => m.exact.includes(s.name));
  if (!hits.length) hits = samples.filter((s) => m.loose(sampleKey(s)));
  if (!hits.length) throw new Error(`no /metrics sample for "${what}" in:\n${samples.text}`);
  // With a loose match, several names may match (e.g. a state label); they must agree on one name.
  const name = hits[0].name;
  return hits.filter((s) => s.name === name).reduce((a, s) => a + s.value, 0);
}

// Polls /metrics until running sequences and used KV blocks are both 0 (or timeoutMs).
export async function waitIdle(server, timeoutMs = 15_000) {
  timeoutMs = ms(timeoutMs);
  const t0 = Date.now();
  let last;
  for (;;) {
    const s = await server.metrics();
    last = { running: metricValue(s, 'running'), kvUsed: metricValue(s, 'kvUsed'), waiting: metricValue(s, 'waiting') };
    if (last.running === 0 && last.kvUsed === 0 && last.waiting === 0) return { ...last, ms: Date.now() - t0 };
    if (Date.now() - t0 > timeoutMs) {
      throw new Error(`server not idle after ${timeoutMs} ms: ${JSON.stringify(last)}\n${s.text}`);
    }
    await sleep(50);
  }
}

// OpenAI error body: {"error": {"message": str, "type": str, "param": str|null, "code": str|int|null}}.
export function assertErrorShape(assert, body, status, what = '') {
  let j = body;
  if (typeof body === 'string') {
    try { j = JSON.parse(body); } catch { assert.fail(`${what}: HTTP ${status} body is not JSON: ${body.slice(0, 300)}`); }
  }
  assert.ok(j && typeof j === 'object' && j.error && typeof j.error === 'object', `${what}: no "error" object: ${JSON.stringify(j)}`);
  const e = j.error;
  assert.equal(typeof e.message, 'string', `${what}: error.message`);
  assert.ok(e.message.length > 0, `${what}: empty error.message`);
  assert.equal(typeof e.type, 'string', `${what}: error.type`);
  assert.ok('param' in e, `${what}: error.param missing`);
  assert.ok(e.param === null || typeof e.param === 'string', `${what}: error.param type`);
  assert.ok('code' in e, `${what}: error.code missing`);
  assert.ok(e.code === null || typeof e.code === 'string' || typeof e.code === 'number', `${what}: error.code type`);
  return e;
}

// Deterministic PRNG (mulberry32) for workloads with a fixed seed.
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Python-ish prompts for the code model (kestrel-tiny was trained on the Python stdlib).
export const CODE_PROMPTS = [
  'def fibonacci(n):',
  'import os\nimport sys\n\ndef main():',
  'class Stack:\n    def __init__(self):',
  'def read_file(path):\n    with open(path) as f:',
  '# Sort a list of numbers\ndef sort_numbers(xs):',
  'for i in range(10):',
  'def is_prime(n):\n    if n < 2:',
  'import json\n\ndef load_config(path):',
  'class Node:\n    """A node of a linked list."""\n\n    def __init__(self, value):',
  'def parse_args(argv):\n    parser = argparse.ArgumentParser(',
  'try:\n    import numpy as np\nexcept ImportError:',
  'def __repr__(self):\n    return',
  'async def fetch(url):',
  'def test_add():\n    assert add(1, 2) ==',
  'with open("data.txt", "w") as f:',
  'def merge(a, b):\n    result = []',
];

// A long Python source (a few hundred tokens) for prefix-cache tests.
export function longPrompt(nFunctions = 12, tag = '') {
  let s = `# module ${tag}\nimport os\nimport re\nimport sys\n\n`;
  for (let i = 0; i < nFunctions; ++i) {
    s += `def helper_${i}(value, scale=${i + 1}):\n    """Return value scaled by ${i + 1}."""\n    if value is None:\n        return None\n    return value * scale + ${i}\n\n\n`;
  }
  return s + 'def main():\n';
}

export async function withTimeout(promise, limitMs, what) {
  let timer;
  const limit = ms(limitMs);
  try {
    return await Promise.race([promise, new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`${what}: timed out after ${limit} ms`)), limit); })]);
  } finally {
    clearTimeout(timer);
  }
}
