// Shared test data of the grammar suite.
#include "grammar_test_util.h"

#include <fstream>
#include <mutex>

namespace kestrel::grammar::testing {

const Tokenizer* Qwen3Tokenizer() {
  static std::once_flag once;
  static std::unique_ptr<Tokenizer> tokenizer;
  static std::string error;
  std::call_once(once, [] {
    const std::string dir = SourcePath("tests/data/npm/qwen3");
    if (!std::ifstream(dir + "/tokenizer.json").good()) {
      error = dir + "/tokenizer.json is missing: run scripts/setup.sh to fetch the tokenizer data";
      return;
    }
    auto loaded = Tokenizer::FromDirectory(dir);
    if (!loaded.ok()) {
      error = loaded.status().message();
      return;
    }
    tokenizer = std::make_unique<Tokenizer>(std::move(loaded).value());
  });
  if (tokenizer == nullptr) ADD_FAILURE() << error;
  return tokenizer.get();
}

}  // namespace kestrel::grammar::testing
