// ChoiceGrammar: exactly one of a list of strings.
#include <string>
#include <vector>

#include "grammar/front_ends.h"
#include "tokenizer/unicode.h"

namespace kestrel::grammar {

Result<Grammar> ChoiceGrammar(std::span<const std::string> choices) {
  if (choices.empty()) return InvalidArgument("choice: the list of choices is empty");
  std::vector<Expr> alternatives;
  for (const std::string& c : choices) {
    if (!tok::IsValidUtf8(c)) return InvalidArgument("choice: a choice is not valid UTF-8");
    alternatives.push_back(Expr::Literal(c));
  }
  Grammar g;
  g.set_root(g.AddRule("root", Expr::Choice(std::move(alternatives))));
  return g;
}

}  // namespace kestrel::grammar
