#!/usr/bin/env node
// HF tokenizers encode throughput (official Node binding, the same Rust core as the Python
// wheel), on the same workload as bench_tokenizer (benches/tokenizer.cpp), so the two can run
// side by side on one machine:
//   lines : every corpus line encoded separately (addSpecialTokens false), median of 3
//   doc   : the corpus lines joined with "\n" into one document, encoded once, median of 3
//
//   node tools/hf_tokenizer_bench.js --module DIR_OF_tokenizers_PACKAGE \
//        --tokenizer-dir tests/data/npm/qwen3 --corpus tests/data/tokenizer/corpus.jsonl
// (see tools/golden_tokenizer_node.js for fetching the `tokenizers` package with npm)
'use strict';
const fs = require('fs');
const path = require('path');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['module', 'tokenizer-dir', 'corpus']) {
  if (!args[k]) { process.stderr.write(`hf_tokenizer_bench.js: --${k} is required\n`); process.exit(2); }
}
const { Tokenizer } = require(path.resolve(args.module));
const tok = Tokenizer.fromFile(path.join(args['tokenizer-dir'], 'tokenizer.json'));
const texts = fs.readFileSync(args.corpus, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l).text);
const lineBytes = texts.reduce((a, x) => a + Buffer.byteLength(x), 0);
const doc = texts.join('\n');
const docBytes = Buffer.byteLength(doc);

async function median3(fn) {
  const t = [];
  let tokens = 0;
  for (let r = 0; r < 3; r++) {
    const s = process.hrtime.bigint();
    tokens = await fn();
    t.push(Number(process.hrtime.bigint() - s) / 1e9);
  }
  t.sort((a, b) => a - b);
  return { seconds: t[1], tokens };
}

(async () => {
  const lines = await median3(async () => {
    let n = 0;
    for (const x of texts) n += (await tok.encode(x, null, { addSpecialTokens: false })).getIds().length;
    return n;
  });
  const whole = await median3(async () => (await tok.encode(doc, null, { addSpecialTokens: false })).getIds().length);
  console.log(JSON.stringify({
    tokenizer: args['tokenizer-dir'],
    lines: { bytes_per_s: lineBytes / lines.seconds, tokens_per_s: lines.tokens / lines.seconds },
    doc: { bytes_per_s: docBytes / whole.seconds, tokens_per_s: whole.tokens / whole.seconds },
  }));
})();
