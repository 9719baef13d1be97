// Syntax tree of a parsed template: expressions and statements, as jinja2's parser builds them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace kestrel::jinja {

using FilterFn = Value (*)(Interp& interp, const Value& subject, CallArgs& args);
using TestFn = bool (*)(Interp& interp, const Value& subject, CallArgs& args);

enum class ExprKind {
  kLiteral,       // literal
  kName,          // name
  kList,          // args: items
  kTuple,         // args: items
  kDict,          // args: key0, value0, key1, value1, ...
  kGetAttr,       // args[0].name
  kGetItem,       // args[0][args[1]]
  kSlice,         // args[0][args[1]:args[2]:args[3]] (missing parts are null)
  kCall,          // args[0](args[1:], kwargs)
  kFilter,        // args[0]|name(args[1:], kwargs); args[0] null: the block being filtered
  kTest,          // args[0] is name(args[1:], kwargs)
  kUnary,         // op args[0]  (kNeg, kPos)
  kBinary,        // args[0] op args[1]
  kCompare,       // args[0] ops[0] args[1] ops[1] args[2] ...
  kAnd,           // args[0] and args[1]
  kOr,            // args[0] or args[1]
  kNot,           // not args[0]
  kCondExpr,      // args[1] if args[0] else args[2] (args[2] may be null)
  kBlockSubject,  // the rendered body of {% filter %} / {% set x | f %}
};

enum class Op {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
  kNeg,
  kPos,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  Op op = Op::kAdd;
  std::vector<Op> ops;  // kCompare
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  FilterFn filter = nullptr;  // kFilter, resolved when parsing
  TestFn test = nullptr;      // kTest, resolved when parsing
};

// Left-hand side of set / for / with.
struct Target {
  enum class Kind { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  std::string name;           // kName; the namespace variable for kNamespaceAttr
  std::string attr;           // kNamespaceAttr
  std::vector<Target> items;  // kTuple
};

enum class StmtKind {
  kText,         // text
  kOutput,       // {{ expr }}
  kIf,           // branches (+ else_body)
  kFor,          // for target in expr [if cond]: body [else: else_body]
  kSet,          // set target = expr
  kSetBlock,     // set target [| filter]: body  (expr: filter chain or null)
  kMacro,        // macro name(params): body
  kCallBlock,    // call(params) expr: body
  kFilterBlock,  // filter expr: body
  kWith,         // with assignments: body
  kScope,        // body rendered in place ({% generation %})
  kBreak,
  kContinue,
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Stmt {
  StmtKind kind = StmtKind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr cond;
  Target target;
  std::vector<std::pair<ExprPtr, StmtList>> branches;
  StmtList body;
  StmtList else_body;
  // kMacro / kCallBlock
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param; null when the param has no default
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
  // kWith
  std::vector<std::pair<Target, ExprPtr>> assignments;
};

}  // namespace kestrel::jinja
