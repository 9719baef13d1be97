// Jump-forward: forced bytes → stable tokens.
#include "grammar/jump_forward.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace kestrel::grammar {

JumpForward ComputeJumpForward(const GrammarMatcher& matcher, const Tokenizer& tokenizer) {
  JumpForward jf;
  jf.forced_bytes = matcher.ForcedBytes();
  // Forced bytes are valid UTF-8 up to a possibly unfinished last character: cut it off.
  const std::string text = jf.forced_bytes.substr(0, tok::Utf8EmittablePrefix(jf.forced_bytes));
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
