// Jump-forward: forced bytes → stable tokens.
#include "grammar/jump_forward.h"

#include <algorithm>

namespace kestrel::grammar {
namespace {

// Length of the longest prefix of text made of whole UTF-8 characters.
size_t CompleteUtf8Prefix(std::string_view text) {
  size_t pos = 0;
  uint32_t cp = 0;
  size_t good = 0;
  while (DecodeUtf8(text, &pos, &cp)) good = pos;
  return good;
}

}  // namespace

JumpForward ComputeJumpForward(const GrammarMatcher& matcher, const Tokenizer& tokenizer) {
  JumpForward jf;
  jf.forced_bytes = matcher.ForcedBytes();
  const std::string text = jf.forced_bytes.substr(0, CompleteUtf8Prefix(jf.forced_bytes));
  if (text.empty()) return jf;

  // Common prefix of the tokenizations of text followed by each probe.
  std::vector<int32_t> stable = tokenizer.Encode(text);
  for (const char* probe : {" ", "a", "A", "0", "\"", ",", "\n", "}", "_", "-", "\xC3\xA9"}) {
    const std::vector<int32_t> ids = tokenizer.Encode(text + probe);
    size_t n = 0;
    while (n < stable.size() && n < ids.size() && stable[n] == ids[n]) ++n;
    stable.resize(n);
  }
  // Keep whole tokens strictly inside the text; the matcher must accept them.
  GrammarMatcher probe = matcher;
  size_t covered = 0;
  for (int32_t id : stable) {
    const std::string bytes = tokenizer.TokenBytes(id);
    if (covered + bytes.size() >= text.size()) break;
    if (text.compare(covered, bytes.size(), bytes) != 0 || !probe.AcceptToken(id)) break;
    jf.tokens.push_back(id);
    covered += bytes.size();
  }
  jf.n_token_bytes = covered;
  return jf;
}

}  // namespace kestrel::grammar
