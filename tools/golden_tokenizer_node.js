#!/usr/bin/env node
// Same goldens as tools/golden_tokenizer.py, byte for byte, from the official Node binding of
// Hugging Face tokenizers (npm package `tokenizers`, the same Rust core as the Python wheel).
// Useful where pip cannot reach PyPI but npm works (the project's machines):
//
//   d=$(mktemp -d) && (cd "$d" && npm pack --silent tokenizers@0.23.2 && tar xzf tokenizers-*.tgz)
//   node tools/golden_tokenizer_node.js --module "$d/package" --tokenizer-dir tests/data/npm/qwen3 \
//       --corpus tests/data/tokenizer/corpus.jsonl --out tests/data/tokenizer/golden_qwen3.jsonl
'use strict';

const fs = require('fs');
const path = require('path');

function fail(message) {
  process.stderr.write(`golden_tokenizer_node.js: error: ${message}\n`);
  process.exit(1);
}

function parseArgs(argv) {
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    const key = argv[i];
    if (!key.startsWith('--') || i + 1 >= argv.length) fail(`bad argument ${key}`);
    args[key.slice(2)] = argv[i + 1];
  }
  for (const k of ['module', 'tokenizer-dir', 'corpus', 'out']) {
    if (!args[k]) fail(`missing --${k}`);
  }
  return args;
}

function escapeLineBreakers(line) {
  return line.replace(/[\u0085\u2028\u2029]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const { Tokenizer } = require(path.resolve(args.module));
  const file = path.join(args['tokenizer-dir'], 'tokenizer.json');
  if (!fs.existsSync(file)) fail(`${file} not found (scripts/setup.sh fetches tests/data/npm/*)`);
  const tokenizer = Tokenizer.fromFile(file);
  const lines = fs.readFileSync(args.corpus, 'utf8').split('\n').filter((l) => l.length > 0);
  const out = [];
  for (const [n, line] of lines.entries()) {
    let text;
    try {
      text = JSON.parse(line).text;
    } catch (e) {
      fail(`${args.corpus}:${n + 1}: bad JSON: ${e.message}`);
    }
    if (typeof text !== 'string') fail(`${args.corpus}:${n + 1}: no string 'text'`);
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
    const ids = Array.from(encoding.getIds());
    const decoded = await tokenizer.decode(ids, false);
    out.push(escapeLineBreakers(JSON.stringify({ ids, decoded })));
  }
  fs.writeFileSync(args.out + '.tmp', out.join('\n') + '\n');
  fs.renameSync(args.out + '.tmp', args.out);
  process.stderr.write(`golden_tokenizer_node.js: wrote ${out.length} lines to ${args.out}\n`);
}

main().catch((e) => fail(e.stack || String(e)));
