// Recursive-descent parser producing the statement tree, following jinja2's grammar
// (operator precedence, tuple rules, test-argument shorthand, statement tags).
#pragma once

#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace kestrel::jinja {

// Throws Error on a syntax error, an unknown tag, or an unknown filter or test (jinja2
// rejects those when compiling, before anything renders).
StmtList Parse(std::vector<Token> tokens);

// Passes run by Parse (resolve.cpp).
// Binds every filter / test name; throws Error for unknown names outside if-branches and
// conditional expressions (jinja2 defers those to run time).
void ResolveNames(StmtList& body);
// Sets macro->uses_varargs / uses_kwargs / uses_caller from the names its body reads.
void ScanSpecialNames(Stmt* macro);

}  // namespace kestrel::jinja
