// Tree-walking evaluator: runs a parsed template against a context, with jinja2's scoping
// (a fresh scope per loop iteration, macro call, with-block) and the sandbox's attribute rules.
// Work is bounded (steps, output size, call depth) so no template can hang or exhaust memory.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace kestrel::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{256} << 20;
  int64_t max_steps = 20'000'000;  // statements executed + loop iterations + calls
  int max_call_depth = 256;        // nested macro / filter-callback calls
};

class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* Lookup(const std::string& name) const;
  void Set(const std::string& name, Value value) { vars_[name] = std::move(value); }
  void Clear() { vars_.clear(); }

 private:
  std::shared_ptr<Scope> parent_;
  std::unordered_map<std::string, Value> vars_;
};
using ScopePtr = std::shared_ptr<Scope>;

// A builtin callable (global function or bound method).
class Function : public Object {
 public:
  using Fn = std::function<Value(Interp&, CallArgs&)>;
  Function(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string TypeName() const override { return "builtin_function_or_method"; }
  std::string Repr() const override { return "<built-in function " + name_ + ">"; }
  bool IsCallable() const override { return true; }
  Value Call(Interp& interp, CallArgs& args) override { return fn_(interp, args); }

 private:
  std::string name_;
  Fn fn_;
};

// namespace(...): the one mutable object templates may assign attributes on.
class Namespace : public Object {
 public:
  std::string TypeName() const override { return "Namespace"; }
  std::string Repr() const override;
  std::optional<Value> GetAttr(std::string_view name) const override;
  bool SetAttr(const std::string& name, const Value& value) override;
  void Clear() { attrs_.clear(); }

 private:
  std::vector<std::pair<std::string, Value>> attrs_;  // insertion order, for repr
};

class Interp {
 public:
  explicit Interp(RenderLimits limits) : limits_(limits) {}

  // Renders `body` with `root` as the outermost scope.
  std::string Render(const StmtList& body, const ScopePtr& root);

  // ---- used by builtins ----
  Value Eval(const Expr& e, const ScopePtr& scope);
  // jinja2 sandbox getattr (attribute first, then item) and getitem (item first).
  Value GetAttr(const Value& obj, std::string_view name);
  Value GetItem(const Value& obj, const Value& key);
  // Attribute only (the `attr` filter): methods and object attributes, no item fallback.
  Value GetAttrOnly(const Value& obj, std::string_view name);
  Value Call(const Value& callee, CallArgs& args);
  Value CallFilter(std::string_view name, const Value& subject, CallArgs& args);
  bool CallTest(std::string_view name, const Value& subject, CallArgs& args);
  // Python iteration: list/tuple items, dict keys, string characters; Undefined is empty.
  ValueList Iterate(const Value& v);
  // Python binary operators and comparisons.
  Value BinaryOp(Op op, const Value& a, const Value& b);
  bool CompareOp(Op op, const Value& a, const Value& b);
  void Step();
  // A macro keeps the scope it was defined in alive, and that scope holds the macro; a
  // namespace can hold a macro too. These reference cycles are broken when the render ends by
  // clearing every scope and namespace registered here.
  void Track(const ScopePtr& scope);
  void Track(const std::shared_ptr<Namespace>& ns);
  // Counts call nesting (macros and callbacks); throws past the limit.
  struct CallGuard {
    explicit CallGuard(Interp* interp);
    ~CallGuard();
    Interp* interp;
  };
  // Runs a macro (or a call block's caller) with bound arguments.
  Value InvokeMacro(const Stmt& macro, const ScopePtr& closure, CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow Exec(const StmtList& body, const ScopePtr& scope, std::string& out);
  Flow ExecFor(const Stmt& s, const ScopePtr& scope, std::string& out);
  void Assign(const Target& t, const Value& v, const ScopePtr& scope);
  Value EvalCall(const Expr& e, const ScopePtr& scope);
  void EvalArgs(const Expr& e, size_t first, const ScopePtr& scope, CallArgs* out);
  Value EvalSlice(const Expr& e, const ScopePtr& scope);
  Value EvalCompare(const Expr& e, const ScopePtr& scope);
  Value ApplyFilterChain(const Expr& chain, const Value& subject, const ScopePtr& scope);
  void Append(std::string& out, const Value& v);

  RenderLimits limits_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  std::vector<Value> block_subjects_;
  std::vector<ScopePtr> tracked_scopes_;
  std::vector<std::shared_ptr<Namespace>> tracked_namespaces_;
  size_t prune_scopes_at_ = 1024;
  size_t prune_namespaces_at_ = 1024;  // innermost {% filter %} / {% set | f %} body
};

}  // namespace kestrel::jinja
