// Token-mask benchmark: drives whole generations through GrammarMatcher with a real tokenizer and
// prints JSON.
//
//   bench_grammar_mask [tokenizer_dir] [repeats] [compile_threads]
//                      (defaults: tests/data/npm/qwen3, 5, 1)
//
// Per scenario (a grammar and a valid instance): the instance is tokenized; at every step the mask
// is computed (timed), the actual next token must be allowed by it, and the matcher accepts it;
// after the last token the grammar must be able to end and the stop token must be allowed.
// Reported: compile time (automaton, token masks), and median / p99 / max microseconds per mask
// over all steps of all repeats.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "grammar/compiled_grammar.h"
#include "grammar/front_ends.h"
#include "grammar/jump_forward.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {

using kestrel::Result;
using kestrel::Tokenizer;
using namespace kestrel::grammar;

const char* kToolCallSchema = R"({
  "type": "object",
  "properties": {
    "name": {"const": "search_flights"},
    "arguments": {
      "type": "object",
      "properties": {
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$", "description": "IATA airport code"},
        "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "departure_date": {"type": "string", "format": "date"},
        "return_date": {"type": ["string", "null"], "format": "date"},
        "passengers": {
          "type": "object",
          "properties": {
            "adults": {"type": "integer", "minimum": 1, "maximum": 9},
            "children": {"type": "integer", "minimum": 0, "maximum": 9}
          },
          "required": ["adults"]
        },
        "cabin": {"enum": ["economy", "premium_economy", "business", "first"]},
        "max_price": {"type": "number", "minimum": 0},
        "airlines": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 5},
        "notes": {"type": "string"}
      },
      "required": ["origin", "destination", "departure_date", "passengers", "cabin"],
      "additionalProperties": false
    }
  },
  "required": ["name", "arguments"],
  "additionalProperties": false
})";

const char* kToolCallInstance =
    "{\"name\": \"search_flights\", \"arguments\": {\"origin\": \"SFO\", \"destination\": \"NRT\", "
    "\"departure_date\": \"2025-03-14\", \"return_date\": null, \"passengers\": {\"adults\": 2, "
    "\"children\": 1}, \"cabin\": \"premium_economy\", \"max_price\": 1850.5, \"airlines\": "
    "[\"United Airlines\", \"ANA \xE5\x85\xA8\xE6\x97\xA5\xE7\xA9\xBA\"], \"notes\": \"Window "
    "seats "
    "if possible; traveling with a \\\"small\\\" dog \xF0\x9F\x90\x95.\"}}";

// Three tools, any one of them: each call is {"name": <tool>, "arguments": {...}}.
const char* kThreeToolsSchema = R"({"anyOf": [
  {"type": "object", "properties": {"name": {"const": "get_weather"}, "arguments": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city"], "additionalProperties": false}}, "required": ["name", "arguments"]},
  {"type": "object", "properties": {"name": {"const": "search_web"}, "arguments": {"type": "object",
    "properties": {"query": {"type": "string", "minLength": 1}, "top_k": {"type": "integer", "minimum": 1, "maximum": 50},
                   "sites": {"type": "array", "items": {"type": "string", "format": "hostname"}}},
    "required": ["query"], "additionalProperties": false}}, "required": ["name", "arguments"]},
  {"type": "object", "properties": {"name": {"const": "run_python"}, "arguments": {"type": "object",
    "properties": {"code": {"type": "string"}, "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600}},
    "required": ["code"], "additionalProperties": false}}, "required": ["name", "arguments"]}
]})";
const char* kThreeToolsInstance =
    "{\"name\": \"run_python\", \"arguments\": {\"code\": \"import math\\nfor i in range(10):\\n   "
    " "
    "print(i, math.sqrt(i))\\n\", \"timeout_s\": 30.5}}";

const char* kJsonObjectInstance =
    "{\n  \"id\": 4182,\n  \"title\": \"Quarterly report\",\n  \"tags\": [\"finance\", \"q3\", "
    "\"draft\"],\n  \"metrics\": {\"revenue\": 1.25e6, \"growth\": -0.031, \"ok\": true},\n  "
    "\"owner\": null,\n  \"summary\": \"Revenue grew in EMEA; APAC flat. See \\u00a75.\"\n}";

const char* kGbnfGrammar = R"g(root ::= call ("; " call)*
call ::= name "(" (arg ("," " "? arg)*)? ")"
name ::= [a-z_] [a-z0-9_]*
arg ::= num | str | call
num ::= "-"? [0-9]+ ("." [0-9]+)?
str ::= "'" [^'\\]* "'")g";
const char* kGbnfInstance = "print(max(3, -12.5), 'hello world'); exit(0)";

double Micros(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

nlohmann::ordered_json RunScenario(const std::string& name, Result<Grammar> grammar,
                                   const std::string& instance, const Tokenizer& tok,
                                   const std::shared_ptr<const Vocabulary>& vocab, int32_t eos,
                                   int repeats, kestrel::ThreadPool* pool) {
  nlohmann::ordered_json out;
  out["scenario"] = name;
  if (!grammar.ok()) {
    out["error"] = grammar.status().message();
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  CompileOptions options;
  options.pool = pool;
  auto compiled = CompiledGrammar::Compile(*grammar, vocab, options);
  const double compile_ms = Micros(std::chrono::steady_clock::now() - t0) / 1000;
  if (!compiled.ok()) {
    out["error"] = compiled.status().message();
    return out;
  }
  const CompileStats& stats = (*compiled)->stats();
  out["compile_ms"] = compile_ms;
  out["automaton_ms"] = stats.automaton_ms;
  out["mask_cache_ms"] = stats.masks_ms;
  out["automaton_states"] = stats.n_states;
  out["mask_entries"] = stats.n_mask_entries;
  out["uncertain_tokens_stored"] = stats.n_uncertain;

  const std::vector<int32_t> tokens = tok.Encode(instance);
  std::vector<uint32_t> mask(vocab->bitmask_words());
  std::vector<double> micros;
  std::vector<double> checked;
  bool all_allowed = true;
  bool all_accepted = true;
  bool ends = true;
  int dead_ends = 0;
  for (int r = 0; r < repeats; ++r) {
    GrammarMatcher m(*compiled, {eos});
    for (int32_t id : tokens) {
      const auto start = std::chrono::steady_clock::now();
      const MaskResult res = m.FillNextTokenBitmask(mask);
      micros.push_back(Micros(std::chrono::steady_clock::now() - start));
      checked.push_back(res.n_checked);
      dead_ends += res.dead_end;
      all_allowed &= ((mask[id >> 5] >> (id & 31)) & 1) != 0;
      all_accepted &= m.AcceptToken(id);
    }
    m.FillNextTokenBitmask(mask);
    ends &= m.CanTerminate() && ((mask[eos >> 5] >> (eos & 31)) & 1) && m.AcceptToken(eos);
  }
  out["tokens"] = tokens.size();
  out["masks_timed"] = micros.size();
  out["mask_us_median"] = Percentile(micros, 0.5);
  out["mask_us_p99"] = Percentile(micros, 0.99);
  out["mask_us_max"] = *std::max_element(micros.begin(), micros.end());
  double sum = 0;
  for (double v : micros) sum += v;
  out["mask_us_mean"] = sum / micros.size();
  out["runtime_checked_tokens_median"] = Percentile(checked, 0.5);
  out["runtime_checked_tokens_max"] = *std::max_element(checked.begin(), checked.end());
  out["every_token_allowed"] = all_allowed;
  out["every_token_accepted"] = all_accepted;
  out["ends_with_stop_token"] = ends;
  out["dead_ends"] = dead_ends;

  // Jump-forward at the start: what the grammar forces before the first sampled token.
  GrammarMatcher fresh(*compiled, {eos});
  const JumpForward jf = ComputeJumpForward(fresh, tok);
  out["forced_at_start"] = jf.forced_bytes;
  out["jump_forward_tokens_at_start"] = jf.tokens.size();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : "tests/data/npm/qwen3";
  const int repeats = argc > 2 ? std::max(1, std::atoi(argv[2])) : 5;
  const int compile_threads = argc > 3 ? std::max(1, std::atoi(argv[3])) : 1;
  std::unique_ptr<kestrel::ThreadPool> pool;
  if (compile_threads > 1) pool = std::make_unique<kestrel::ThreadPool>(compile_threads);
  auto tok = Tokenizer::FromDirectory(dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "bench_grammar_mask: %s (run scripts/setup.sh for the tokenizer data)\n",
                 tok.status().message().c_str());
    return 1;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto vocab = Vocabulary::FromTokenizer(*tok);
  const double vocab_ms = Micros(std::chrono::steady_clock::now() - t0) / 1000;
  auto eos_id = tok->TokenToId("<|im_end|>");
  if (!eos_id) eos_id = tok->TokenToId(tok->eos_token());
  const int32_t eos = eos_id.value_or(0);

  nlohmann::ordered_json report;
  report["tokenizer"] = dir;
  report["vocab_size"] = vocab->vocab_size();
  report["text_tokens"] = vocab->n_text_tokens();
  report["trie_nodes"] = vocab->n_nodes();
  report["vocabulary_build_ms"] = vocab_ms;
  report["repeats"] = repeats;
  report["compile_threads"] = compile_threads;
  report["scenarios"] = nlohmann::ordered_json::array();
  report["scenarios"].push_back(RunScenario("tool_call_json_schema",
                                            JsonSchemaToGrammar(kToolCallSchema), kToolCallInstance,
                                            *tok, vocab, eos, repeats, pool.get()));
  JsonSchemaOptions python;
  python.layout = JsonSchemaOptions::Layout::kPythonSeparators;
  report["scenarios"].push_back(RunScenario(
      "tool_call_json_schema_python_separators", JsonSchemaToGrammar(kToolCallSchema, python),
      kToolCallInstance, *tok, vocab, eos, repeats, pool.get()));
  report["scenarios"].push_back(
      RunScenario("three_tools_any_of", JsonSchemaToGrammar(kThreeToolsSchema), kThreeToolsInstance,
                  *tok, vocab, eos, repeats, pool.get()));
  report["scenarios"].push_back(RunScenario("json_object", JsonObjectGrammar(), kJsonObjectInstance,
                                            *tok, vocab, eos, repeats, pool.get()));
  report["scenarios"].push_back(RunScenario("gbnf_calls", ParseGbnf(kGbnfGrammar), kGbnfInstance,
                                            *tok, vocab, eos, repeats, pool.get()));
  std::printf("%s\n", report.dump(2).c_str());
  return 0;
}
