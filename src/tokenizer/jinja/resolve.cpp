// Passes over a parsed template: binding filter / test names, and finding which special names
// (varargs, kwargs, caller) a macro uses.
#include <string>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/parser.h"

namespace kestrel::jinja {

namespace {

// Binds filter and test names to their implementations. jinja2 rejects an unknown name when
// compiling, except inside an if statement or a conditional expression ("soft" frames, so
// `{% if x is filter %}` guards work): there the error waits until the filter is called.
class Resolver {
 public:
  void Stmts(StmtList& list, bool soft) {
    for (auto& s : list) Statement(*s, soft);
  }

 private:
  void Statement(Stmt& s, bool soft) {
    switch (s.kind) {
      case StmtKind::kIf:
        for (auto& [cond, body] : s.branches) {
          Expression(cond.get(), true);
          Stmts(body, true);
        }
        Stmts(s.else_body, true);
        return;
      case StmtKind::kOutput:
      case StmtKind::kSet:
        Expression(s.expr.get(), soft);
        return;
      case StmtKind::kScope:
        Stmts(s.body, soft);
        return;
      default:
        // Loops, macros, call / filter / with blocks and block sets open a new frame; the
        // filters of filter blocks and block sets are evaluated inside it.
        Expression(s.expr.get(),
                   soft && s.kind != StmtKind::kSetBlock && s.kind != StmtKind::kFilterBlock);
        Expression(s.cond.get(), false);
        for (auto& d : s.defaults) Expression(d.get(), false);
        for (auto& a : s.assignments) Expression(a.second.get(), soft);
        Stmts(s.body, false);
        Stmts(s.else_body, false);
        return;
    }
  }

  void Expression(Expr* e, bool soft) {
    if (e == nullptr) return;
    if (e->kind == ExprKind::kCondExpr) soft = true;
    if (e->kind == ExprKind::kFilter) {
      e->filter = FindFilter(e->name);
      if (e->filter == nullptr && !soft) Fail("No filter named '" + e->name + "'.", e->line);
    } else if (e->kind == ExprKind::kTest) {
      e->test = FindTest(e->name);
      if (e->test == nullptr && !soft) Fail("No test named '" + e->name + "'.", e->line);
    }
    for (auto& a : e->args) Expression(a.get(), soft);
    for (auto& kv : e->kwargs) Expression(kv.second.get(), soft);
  }

  [[noreturn]] static void Fail(const std::string& msg, int line) {
    throw Error("template syntax error (line " + std::to_string(line) + "): " + msg);
  }
};

void ScanExpr(const Expr* e, Stmt* m) {
  if (e == nullptr) return;
  if (e->kind == ExprKind::kName) {
    m->uses_varargs |= e->name == "varargs";
    m->uses_kwargs |= e->name == "kwargs";
    m->uses_caller |= e->name == "caller";
  }
  for (const auto& a : e->args) ScanExpr(a.get(), m);
  for (const auto& kv : e->kwargs) ScanExpr(kv.second.get(), m);
}

void ScanStmts(const StmtList& list, Stmt* m) {
  for (const auto& st : list) {
    ScanExpr(st->expr.get(), m);
    ScanExpr(st->cond.get(), m);
    for (const auto& br : st->branches) {
      ScanExpr(br.first.get(), m);
      ScanStmts(br.second, m);
    }
    for (const auto& d : st->defaults) ScanExpr(d.get(), m);
    for (const auto& as : st->assignments) ScanExpr(as.second.get(), m);
    if (st->kind != StmtKind::kMacro) ScanStmts(st->body, m);
    ScanStmts(st->else_body, m);
  }
}

}  // namespace

void ResolveNames(StmtList& body) {
  Resolver().Stmts(body, false);
}

void ScanSpecialNames(Stmt* macro) {
  ScanStmts(macro->body, macro);
  for (const auto& d : macro->defaults) ScanExpr(d.get(), macro);
}

}  // namespace kestrel::jinja
