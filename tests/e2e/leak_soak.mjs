// Leak soak (ctest e2e_leak_soak, label server): 1,000 short requests against `kestrel serve`, a
// fixed-seed mix of chat / completions, streamed / plain, greedy / sampled, with random client
// disconnects (before the response, mid-stream). Afterwards /metrics must show 0 running
// sequences, 0 waiting and 0 used KV blocks, and the server's RSS (VmRSS) after warm-up vs at the
// end must stay flat (growth < 10 %, and < 3 % over the second half). Prints the figures as JSON.
//
// Env: KESTREL_SOAK_REQUESTS (1000), KESTREL_SOAK_CONCURRENCY (12), KESTREL_SOAK_SEED (42),
//      KESTREL_SOAK_WARMUP (512 requests at concurrency 64 before the RSS baseline),
//      KESTREL_SOAK_KV_GIB (0.03: a small pool, so warm-up touches all of it and blocks get reused).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { readFileSync } from 'node:fs';
import { Server, curl, metricValue, waitIdle, rng, sleep, ms, SANITIZED, CODE_PROMPTS, longPrompt } from './lib/harness.mjs';

const N = Number(process.env.KESTREL_SOAK_REQUESTS ?? (SANITIZED ? 200 : 1000));
const CONC = Number(process.env.KESTREL_SOAK_CONCURRENCY ?? 12);
const SEED = Number(process.env.KESTREL_SOAK_SEED ?? 42);
const KV_GIB = process.env.KESTREL_SOAK_KV_GIB ?? '0.03';
// Warm-up before the RSS baseline: enough concurrent requests that every HTTP worker thread of
// the server (64 by default) has served requests, since each one grows once to a bounded size
// (stack pages, malloc arena, the tokenizer's per-thread word cache of ~1-3 MiB).
const WARMUP = Number(process.env.KESTREL_SOAK_WARMUP ?? (SANITIZED ? 64 : 512));
const WARMUP_CONC = 64;

// One request; resolves { outcome: 'ok' | 'aborted' | 'http-<status>' | 'error', ms }.
function send(server, agent, plan) {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const payload = JSON.stringify(plan.body);
    let settled = false;
    const done = (outcome, extra = {}) => {
      if (settled) return;
      settled = true;
      resolve({ outcome, ms: Date.now() - t0, ...extra });
    };
    const req = http.request({ host: '127.0.0.1', port: server.port, method: 'POST', path: plan.path, agent,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      let body = '';
      let events = 0;
      res.setEncoding('utf8');
      res.on('data', (d) => {
        body += d;
        if (plan.body.stream) {
          events = (body.match(/^data: /gm) ?? []).length;
          if (plan.abortAfterEvents && events >= plan.abortAfterEvents) {
            req.destroy();
            done('aborted');
          }
        }
      });
      res.on('end', () => {
        if (res.statusCode !== 200) return done(`http-${res.statusCode}`, { body: body.slice(0, 200) });
        if (plan.body.stream && !/data: \[DONE\]\s*$/.test(body)) return done('error', { body: body.slice(-200) });
        if (!plan.body.stream) {
          try { JSON.parse(body); } catch { return done('error', { body: body.slice(0, 200) }); }
        }
        done('ok');
      });
      res.on('error', () => done(settled ? 'aborted' : 'error'));
    });
    req.on('error', (e) => done(settled ? 'aborted' : 'error', { error: e.message }));
    if (plan.abortAfterMs !== undefined) {
      setTimeout(() => { if (!settled) { req.destroy(); done('aborted'); } }, plan.abortAfterMs);
    }
    req.end(payload);
  });
}

function makePlans(model, n, seed) {
  const r = rng(seed);
  const pick = (xs) => xs[Math.floor(r() * xs.length)];
  const plans = [];
  for (let i = 0; i < n; ++i) {
    const chat = r() < 0.5;
    const stream = r() < 0.7;
    const long = r() < 0.1;
    const prompt = long ? longPrompt(8 + Math.floor(r() * 8), `soak-${Math.floor(r() * 4)}`) : `${pick(CODE_PROMPTS)}${r() < 0.5 ? '' : ` # ${i}`}`;
    const body = { model, max_tokens: 1 + Math.floor(r() * 12), stream };
    if (r() < 0.5) { body.temperature = 0.8; body.seed = i; } else { body.temperature = 0; }
    if (chat) body.messages = [{ role: 'user', content: prompt }]; else body.prompt = prompt;
    if (stream && r() < 0.5) body.stream_options = { include_usage: true };
    if (r() < 0.1) body.logprobs = chat ? true : 2;
    if (chat && body.logprobs) body.top_logprobs = 2;
    const plan = { path: chat ? '/v1/chat/completions' : '/v1/completions', body };
    const d = r();
    if (d < 0.15) plan.abortAfterMs = Math.floor(r() * 30);                       // before/around the response
    else if (d < 0.35 && stream) plan.abortAfterEvents = 1 + Math.floor(r() * 4);  // mid-stream
    plans.push(plan);
  }
  return plans;
}

test(`leak soak: ${N} requests with random disconnects; idle metrics and flat RSS`, { timeout: ms(600_000) }, async (t) => {
  const server = await new Server({ args: ['--max-num-seqs', '16', '--kv-memory', KV_GIB] }).start();
  const keepAlive = new http.Agent({ keepAlive: true, maxSockets: WARMUP_CONC });
  try {
    const model = (await curl(server, '/v1/models')).json.data[0].id;
    const warmPlans = makePlans(model, WARMUP, SEED + 1);
    const plans = makePlans(model, N, SEED);
    const outcomes = {};
    const rssSeries = [];
    let completed = 0;
    const runRange = async (list, start, end, conc) => {
      let next = start;
      const worker = async () => {
        while (next < end) {
          const i = next++;
          const plan = list[i];
          // Connections that will be cut get their own socket; the others share keep-alive ones.
          const agent = plan.abortAfterMs !== undefined || plan.abortAfterEvents ? false : keepAlive;
          const res = await send(server, agent, plan);
          outcomes[res.outcome] = (outcomes[res.outcome] ?? 0) + 1;
          if (res.outcome !== 'ok' && res.outcome !== 'aborted') t.diagnostic(`request ${i}: ${JSON.stringify(res)}`);
          ++completed;
        }
      };
      await Promise.all(Array.from({ length: conc }, worker));
    };
    const rssStart = server.rssKiB();
    await runRange(warmPlans, 0, WARMUP, WARMUP_CONC);
    await waitIdle(server, 30_000);
    await sleep(200);
    const rssWarm = server.rssKiB();
    rssSeries.push({ after: 0, rss_kib: rssWarm });
    const warmOutcomes = { ...outcomes };
    for (const k of Object.keys(outcomes)) delete outcomes[k];
    completed = 0;
    const t0 = Date.now();
    for (let start = 0; start < N; start += 100) {
      await runRange(plans, start, Math.min(start + 100, N), CONC);
      rssSeries.push({ after: Math.min(start + 100, N), rss_kib: server.rssKiB() });
    }
    const idle = await waitIdle(server, 30_000);
    await sleep(200);
    const rssEnd = server.rssKiB();
    const rssMid = rssSeries[Math.floor(rssSeries.length / 2)].rss_kib;
    const m = await server.metrics();
    const wall = (Date.now() - t0) / 1000;
    const report = {
      requests: completed,
      wall_s: Number(wall.toFixed(1)),
      requests_per_s: Number((completed / wall).toFixed(1)),
      outcomes,
      warmup_outcomes: warmOutcomes,
      idle,
      kv_blocks_free: (() => { try { return metricValue(m, 'kvFree'); } catch { return null; } })(),
      preemptions: m.find((x) => /preempt/.test(x.name))?.value ?? null,
      cancelled: m.filter((x) => /finished/.test(x.name) && x.labels.finish_reason === 'cancelled').reduce((a, x) => a + x.value, 0),
      warmup_requests: WARMUP,
      rss_kib_at_start: rssStart,
      rss_kib_after_warmup: rssWarm,
      rss_kib_end: rssEnd,
      rss_growth_pct: Number((100 * (rssEnd - rssWarm) / rssWarm).toFixed(2)),
      rss_growth_second_half_pct: Number((100 * (rssEnd - rssMid) / rssMid).toFixed(2)),
      rss_series: rssSeries,
    };
    console.log(JSON.stringify(report, null, 1));
    t.diagnostic(JSON.stringify(report));
    assert.equal(completed, N);
    assert.equal(idle.running, 0, 'no running sequences');
    assert.equal(idle.waiting, 0, 'empty queue');
    assert.equal(idle.kvUsed, 0, 'no used KV blocks');
    const bad = Object.entries(outcomes).filter(([k]) => k !== 'ok' && k !== 'aborted');
    assert.deepEqual(bad, [], 'every request not cut by the client succeeded');
    // Under AddressSanitizer the quarantine of freed memory grows RSS by design: report only.
    const asan = /libasan/.test(readFileSync(`/proc/${server.pid}/maps`, 'utf8'));
    if (asan) {
      t.diagnostic('AddressSanitizer build: RSS figures reported, not checked');
    } else {
      assert.ok(report.rss_growth_pct < 10, `RSS grew ${report.rss_growth_pct} % (${rssWarm} → ${rssEnd} KiB)`);
      assert.ok(report.rss_growth_second_half_pct < 3, `RSS grew ${report.rss_growth_second_half_pct} % over the second half`);
    }
    const h = await curl(server, '/health');
    assert.equal(h.status, 200);
  } finally {
    keepAlive.destroy();
    const r = await server.stop();
    assert.equal(r.code, 0, `exit ${JSON.stringify(r)}`);
  }
});
