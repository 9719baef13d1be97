// Tokenizer encode throughput, single thread. Prints one JSON object.
//
//   bench_tokenizer <tokenizer_dir> <corpus.jsonl>   (CMake: benches/<name>.cpp -> bench_<name>)
//
// Same workload as `tools/golden_tokenizer.py --bench` (so the numbers compare with HF):
//   lines: every corpus line encoded separately (add_special_tokens=false);
//   doc20x: the corpus lines joined with "\n" into one document, encoded 20 times.
// Each is timed 3 times; the median is reported.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace {

constexpr int kRepeats = 3;
constexpr int kDocCopies = 20;

struct Measurement {
  double seconds = 0;
  size_t n_bytes = 0;
  size_t n_tokens = 0;
};

template <class Fn>
Measurement MedianOf(Fn&& run) {
  std::vector<Measurement> runs;
  for (int r = 0; r < kRepeats; ++r) {
    Measurement m;
    const auto start = std::chrono::steady_clock::now();
    run(&m);
    m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    runs.push_back(m);
  }
  std::sort(runs.begin(), runs.end(),
            [](const Measurement& a, const Measurement& b) { return a.seconds < b.seconds; });
  return runs[runs.size() / 2];
}

nlohmann::json ToJson(const Measurement& m) {
  return {{"seconds", m.seconds},
          {"n_bytes", m.n_bytes},
          {"n_tokens", m.n_tokens},
          {"bytes_per_s", m.n_bytes / m.seconds},
          {"tokens_per_s", m.n_tokens / m.seconds}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <tokenizer_dir> <corpus.jsonl>\n", argv[0]);
    return 2;
  }
  const auto load_start = std::chrono::steady_clock::now();
  auto tokenizer = kestrel::Tokenizer::FromDirectory(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "error: %s\n", tokenizer.status().message().c_str());
    return 1;
  }
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

  std::ifstream in(argv[2]);
  if (!in) {
    std::fprintf(stderr, "error: cannot open %s\n", argv[2]);
    return 1;
  }
  std::vector<std::string> texts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("text") || !j["text"].is_string()) {
      std::fprintf(stderr, "error: %s: bad line %zu\n", argv[2], texts.size() + 1);
      return 1;
    }
    texts.push_back(j["text"].get<std::string>());
  }
  std::string doc;
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i > 0) doc += '\n';
    doc += texts[i];
  }

  const kestrel::Tokenizer& tok = *tokenizer;
  // Warm-up (page faults, caches), not timed.
  for (const std::string& t : texts) (void)tok.Encode(t);

  const Measurement lines = MedianOf([&](Measurement* m) {
    for (const std::string& t : texts) {
      m->n_tokens += tok.Encode(t).size();
      m->n_bytes += t.size();
    }
  });
  const Measurement doc20x = MedianOf([&](Measurement* m) {
    for (int c = 0; c < kDocCopies; ++c) {
      m->n_tokens += tok.Encode(doc).size();
      m->n_bytes += doc.size();
    }
  });

  const nlohmann::json out = {{"tokenizer_dir", argv[1]},
                              {"corpus", argv[2]},
                              {"n_lines", texts.size()},
                              {"load_seconds", load_seconds},
                              {"threads", 1},
                              {"lines", ToJson(lines)},
                              {"doc20x", ToJson(doc20x)}};
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
