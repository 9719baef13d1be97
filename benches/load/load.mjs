// Load benchmark of `kestrel serve` (a benchmark, not a test): closed-loop streaming clients on a
// fixed-seed workload, then the HTTP overhead against in-process generation at batch 1.
// Normally started by benches/load/run.sh, which starts and stops the server. Prints one JSON object.
//
//   node benches/load/load.mjs --url http://127.0.0.1:PORT --binary build/release/kestrel \
//        --model models/kestrel-tiny [--concurrency 1,4,16] [--requests-per-client 4] [--max-tokens 128]
//        [--seed 1234] [--overhead-tokens 512] [--overhead-runs 9] [--threads N] [--server-pid PID]
//
// Figures:
//   ttft_ms     time from sending the request to the first streamed token (p50/p99 over requests)
//   itl_ms      gap between consecutive streamed text chunks (p50/p99 over all gaps); the server
//               sends one chunk per token unless text is held back (stop strings, partial UTF-8):
//               content_chunks vs output_tokens in the report shows how close to 1:1 it was
//   tpot_ms     per request (t_last_chunk - t_first_chunk) / (completion_tokens - 1), mean
//   output_tok_per_s  completion tokens of the level / its wall time; requests_per_s likewise
//   overhead    decode tok/s of `kestrel generate --temperature 0 --ignore-eos` (its stderr line
//               'decode: K tokens in S s (R tok/s)') vs the same prompt streamed through the server
//               by one client: (K-1)/(t_last - t_first); medians of interleaved runs.
import http from 'node:http';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';

function parseArgs(argv) {
  const o = {
    url: null, binary: null, model: null, concurrency: '1,4,16', requestsPerClient: 4, maxTokens: 128, seed: 1234,
    overheadTokens: 512, overheadRuns: 9, threads: null, serverPid: null,
  };
  for (let i = 2; i < argv.length; ++i) {
    const k = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(k in o)) throw new Error(`unknown flag ${argv[i]}`);
    o[k] = argv[++i];
  }
  for (const k of ['requestsPerClient', 'maxTokens', 'seed', 'overheadTokens', 'overheadRuns']) o[k] = Number(o[k]);
  o.concurrency = String(o.concurrency).split(',').map(Number);
  if (!o.url) throw new Error('--url is required');
  return o;
}

function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const SNIPPETS = [
  'def fibonacci(n):', 'import os\nimport sys\n\ndef main():', 'class Stack:\n    def __init__(self):',
  'def read_file(path):\n    with open(path) as f:', 'for i in range(', 'def is_prime(n):\n    if n < 2:',
  'import json\n\ndef load_config(path):', 'class Node:\n    def __init__(self, value):',
];

// Prompts of varied lengths (~10 to ~1000 tokens): a random number of helper functions + a snippet.
function makePrompt(r, i) {
  const nFuncs = [0, 0, 1, 2, 4, 8, 16, 32][Math.floor(r() * 8)];
  let s = `# request ${i}\n`;
  for (let f = 0; f < nFuncs; ++f) {
    const k = Math.floor(r() * 1000);
    s += `def helper_${k}(value, scale=${f + 1}):\n    """Scale value by ${f + 1}."""\n    return value * scale + ${k}\n\n\n`;
  }
  return s + SNIPPETS[Math.floor(r() * SNIPPETS.length)];
}

const agent = new http.Agent({ keepAlive: true, maxSockets: 256 });

function post(url, path, body) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const payload = JSON.stringify(body);
    const req = http.request({ host: u.hostname, port: u.port, path, method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { data += d; });
      res.on('end', () => resolve({ status: res.statusCode, body: data }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

// One streamed completion (no logprobs: nothing beyond what generate computes). Returns
// { tSend, chunks: [arrival time of each chunk with text], usage }.
function streamCompletion(url, body) {
  return new Promise((resolve, reject) => {
    const u = new URL(url);
    const payload = JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } });
    const tSend = performance.now();
    const chunks = [];
    let usage = null;
    const req = http.request({ host: u.hostname, port: u.port, path: '/v1/completions', method: 'POST', agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      if (res.statusCode !== 200) {
        let e = '';
        res.on('data', (d) => { e += d; });
        res.on('end', () => reject(new Error(`HTTP ${res.statusCode}: ${e}`)));
        return;
      }
      res.setEncoding('utf8');
      let buf = '';
      res.on('data', (d) => {
        const t = performance.now();
        buf += d;
        let i;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          if (!block.startsWith('data: ')) continue;
          const data = block.slice(6);
          if (data === '[DONE]') continue;
          const j = JSON.parse(data);
          if (j.usage) usage = j.usage;
          const c = j.choices?.[0];
          if (c?.text) chunks.push(t);
        }
      });
      res.on('end', () => resolve({ tSend, chunks, usage }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(payload);
  });
}

function pct(xs, p) {
  if (!xs.length) return null;
  const s = Float64Array.from(xs).sort();
  const idx = Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1));
  return s[idx];
}
const r3 = (x) => (x == null ? null : Number(x.toFixed(3)));
const median = (xs) => pct(xs, 50);

async function detectIgnoreEos(url, model) {
  // 'mean(xs)' greedily ends with EOS after 22 tokens (models/kestrel-tiny/golden.json).
  const body = { model, prompt: '# Compute the mean of a list\ndef mean(xs):', max_tokens: 48, temperature: 0, ignore_eos: true };
  const r = await post(url, '/v1/completions', body);
  if (r.status !== 200) return false;
  return JSON.parse(r.body).usage.completion_tokens === 48;
}

async function runLevel(o, model, conc, ignoreEos, prompts) {
  let next = 0;
  const results = [];
  const t0 = performance.now();
  const worker = async () => {
    while (next < prompts.length) {
      const prompt = prompts[next++];
      const body = { model, prompt, max_tokens: o.maxTokens, temperature: 0 };
      if (ignoreEos) body.ignore_eos = true;
      results.push(await streamCompletion(o.url, body));
    }
  };
  await Promise.all(Array.from({ length: conc }, worker));
  const wall = (performance.now() - t0) / 1000;
  const ttft = [];
  const itl = [];
  const tpot = [];
  let outTokens = 0;
  let promptTokens = 0;
  let cached = 0;
  let contentChunks = 0;
  for (const r of results) {
    outTokens += r.usage?.completion_tokens ?? 0;
    promptTokens += r.usage?.prompt_tokens ?? 0;
    cached += r.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    if (!r.chunks.length) continue;
    contentChunks += r.chunks.length;
    ttft.push(r.chunks[0] - r.tSend);
    for (let k = 1; k < r.chunks.length; ++k) itl.push(r.chunks[k] - r.chunks[k - 1]);
    const nTok = r.usage?.completion_tokens ?? r.chunks.length;
    if (nTok > 1) tpot.push((r.chunks.at(-1) - r.chunks[0]) / (nTok - 1));
  }
  return {
    concurrency: conc,
    requests: results.length,
    wall_s: r3(wall),
    prompt_tokens: promptTokens,
    cached_prompt_tokens: cached,
    output_tokens: outTokens,
    ttft_ms: { p50: r3(pct(ttft, 50)), p99: r3(pct(ttft, 99)) },
    itl_ms: { p50: r3(pct(itl, 50)), p99: r3(pct(itl, 99)) },
    tpot_ms_mean_of_requests: r3(tpot.reduce((a, b) => a + b, 0) / (tpot.length || 1)),
    output_tok_per_s: r3(outTokens / wall),
    requests_per_s: r3(results.length / wall),
    content_chunks: contentChunks,
  };
}

function generateInProcess(o, prompt, n) {
  return new Promise((resolve, reject) => {
    const args = ['generate', '--model', o.model, '--prompt', prompt, '--max-tokens', String(n), '--temperature', '0', '--ignore-eos'];
    if (o.threads) args.push('--threads', String(o.threads));
    execFile(o.binary, args, { maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      if (err) return reject(new Error(`kestrel generate: ${err.message}\n${stderr}`));
      const m = stderr.match(/decode: (\d+) tokens in ([\d.]+) s \(([\d.]+) tok\/s\)/);
      if (!m) return reject(new Error(`no decode line in: ${stderr}`));
      resolve({ tokens: Number(m[1]), seconds: Number(m[2]), tok_per_s: Number(m[3]), text: stdout });
    });
  });
}

async function overhead(o, model, ignoreEos) {
  // 'def fibonacci(n):' greedily repeats ", 0" for well over 1,000 tokens, so the server generates
  // the same N tokens with or without ignore_eos.
  const prompt = 'def fibonacci(n):';
  const n = o.overheadTokens;
  const inproc = [];
  const served = [];
  const body = { model, prompt, max_tokens: n, temperature: 0 };
  if (ignoreEos) body.ignore_eos = true;
  await streamCompletion(o.url, { ...body, max_tokens: 8 });  // warm
  for (let i = 0; i < o.overheadRuns; ++i) {
    const g = await generateInProcess(o, prompt, n);
    inproc.push(g.tok_per_s);
    const s = await streamCompletion(o.url, body);
    const nTok = s.usage?.completion_tokens;
    if (nTok !== n) throw new Error(`server generated ${nTok} tokens, wanted ${n}`);
    served.push((nTok - 1) / ((s.chunks.at(-1) - s.chunks[0]) / 1000));
  }
  const a = median(inproc);
  const b = median(served);
  const aBest = Math.max(...inproc);
  const bBest = Math.max(...served);
  return {
    prompt,
    tokens: n,
    runs: o.overheadRuns,
    in_process_decode_tok_per_s: { median: r3(a), best: r3(aBest), all: inproc.map(r3) },
    server_stream_decode_tok_per_s: { median: r3(b), best: r3(bBest), all: served.map(r3) },
    server_over_in_process: r3(b / a),
    overhead_pct: r3(100 * (1 - b / a)),
    // Best of each: less sensitive to other load on a shared machine.
    overhead_pct_best_of_runs: r3(100 * (1 - bBest / aBest)),
    // Median over the runs of (1 - server/in-process) of each back-to-back pair.
    overhead_pct_median_of_pairs: r3(100 * (1 - median(served.map((x, i) => x / inproc[i])))),
    goal_overhead_pct: 2,
  };
}

async function main() {
  const o = parseArgs(process.argv);
  const models = JSON.parse((await new Promise((resolve, reject) => {
    http.get(`${o.url}/v1/models`, (res) => { let d = ''; res.on('data', (c) => { d += c; }); res.on('end', () => resolve(d)); }).on('error', reject);
  })));
  const model = models.data[0].id;
  const ignoreEos = await detectIgnoreEos(o.url, model);
  const r = rng(o.seed);
  const levels = [];
  for (const conc of o.concurrency) {
    const prompts = Array.from({ length: conc * o.requestsPerClient }, (_, i) => makePrompt(r, i + 1000 * conc));
    levels.push(await runLevel(o, model, conc, ignoreEos, prompts));
  }
  const out = {
    bench: 'kestrel serve load',
    model,
    workload: { seed: o.seed, max_tokens: o.maxTokens, requests_per_client: o.requestsPerClient, temperature: 0,
      ignore_eos: ignoreEos, prompts: 'fixed-seed Python prompts of ~10 to ~1000 tokens', endpoint: '/v1/completions (stream)' },
    levels,
  };
  if (o.binary) out.overhead_batch1 = await overhead(o, model, ignoreEos);
  if (o.serverPid) {
    try {
      const st = readFileSync(`/proc/${o.serverPid}/status`, 'utf8');
      out.server_rss_kib = { now: Number(st.match(/VmRSS:\s+(\d+)/)[1]), peak: Number(st.match(/VmHWM:\s+(\d+)/)[1]) };
    } catch { /* not on this machine */ }
  }
  agent.destroy();
  console.log(JSON.stringify(out, null, 2));
}

main().catch((e) => {
  console.error(`load.mjs: ${e.stack ?? e}`);
  process.exit(1);
});
