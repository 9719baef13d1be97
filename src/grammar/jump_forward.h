// Jump-forward decoding: when the grammar forces the next bytes (a fixed key, a separator), append
// their tokens without running the model for each.
//
// ComputeJumpForward re-tokenizes the forced text and keeps only the tokens that do not depend on
// what follows: the tokenization of the forced text is compared with that of the text followed by
// a few probe continuations, only their common prefix is kept, and the last token of it is dropped
// when it reaches the end of the forced text (a byte-level BPE may merge it with the next bytes:
// `"` then `name` is one token `"name` in many vocabularies).
//
// Where this differs from masked sampling, token by token:
//   * the forced tokens start a new token at the jump: the model might have merged the last
//     sampled token with the first forced bytes (`{` sampled, `"` forced: one token `{"` for a
//     model left alone); the sampled token is already in the KV cache and is not re-tokenized;
//   * the kept tokens are the tokenizer's canonical split; masked sampling accepts any split of
//     the same bytes, and a model may prefer a non-canonical one;
//   * forced text ending inside a UTF-8 character is cut before that character.
// Both produce text the grammar accepts; only the token sequence (and so the model's view of it)
// can differ. The caller appends `tokens` (AcceptToken each) and feeds them to the model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace kestrel::grammar {

struct JumpForward {
  std::string forced_bytes;     // matcher.ForcedBytes()
  std::vector<int32_t> tokens;  // tokens to append; their bytes start forced_bytes
  size_t n_token_bytes = 0;     // bytes `tokens` cover
};

JumpForward ComputeJumpForward(const GrammarMatcher& matcher, const Tokenizer& tokenizer);

}  // namespace kestrel::grammar
