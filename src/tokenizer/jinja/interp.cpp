#include "tokenizer/jinja/interp.h"

#include <algorithm>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

// ---------------------------------------------------------------- scopes and objects

const Value* Scope::Lookup(const std::string& name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_.get()) {
    auto it = s->vars_.find(name);
    if (it != s->vars_.end()) return &it->second;
  }
  return nullptr;
}

std::string Namespace::Repr() const {
  Dict d;
  for (const auto& [k, v] : attrs_) d.Set(Value::MakeString(k), v);
  return "<Namespace " + ToRepr(Value::MakeDict(std::move(d))) + ">";
}

std::optional<Value> Namespace::GetAttr(std::string_view name) const {
  for (const auto& [k, v] : attrs_) {
    if (k == name) return v;
  }
  return std::nullopt;
}

bool Namespace::SetAttr(const std::string& name, const Value& value) {
  for (auto& [k, v] : attrs_) {
    if (k == name) {
      v = value;
      return true;
    }
  }
  attrs_.emplace_back(name, value);
  return true;
}

namespace {

// The `loop` variable of a for loop.
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
 public:
  explicit LoopObject(std::shared_ptr<const ValueList> items) : items_(std::move(items)) {}
  void set_index(size_t i) { index0_ = i; }

  std::string TypeName() const override { return "LoopContext"; }
  std::string Repr() const override {
    return "<LoopContext " + std::to_string(index0_ + 1) + "/" + std::to_string(items_->size()) +
           ">";
  }

  std::optional<Value> GetAttr(std::string_view name) const override {
    const auto n = static_cast<int64_t>(items_->size());
    const auto i = static_cast<int64_t>(index0_);
    if (name == "index") return Value::MakeInt(i + 1);
    if (name == "index0") return Value::MakeInt(i);
    if (name == "revindex") return Value::MakeInt(n - i);
    if (name == "revindex0") return Value::MakeInt(n - i - 1);
    if (name == "first") return Value::MakeBool(i == 0);
    if (name == "last") return Value::MakeBool(i == n - 1);
    if (name == "length") return Value::MakeInt(n);
    if (name == "depth") return Value::MakeInt(1);
    if (name == "depth0") return Value::MakeInt(0);
    if (name == "previtem") {
      if (i == 0) return Value::MakeUndefined("there is no previous item");
      return (*items_)[index0_ - 1];
    }
    if (name == "nextitem") {
      if (i + 1 >= n) return Value::MakeUndefined("there is no next item");
      return (*items_)[index0_ + 1];
    }
    auto self = std::const_pointer_cast<LoopObject>(shared_from_this());
    if (name == "cycle") {
      return Value::MakeObject(
          std::make_shared<Function>("cycle", [self](Interp&, CallArgs& args) -> Value {
            if (args.positional.empty()) throw Error("no items for cycling given");
            return args.positional[self->index0_ % args.positional.size()];
          }));
    }
    if (name == "changed") {
      return Value::MakeObject(
          std::make_shared<Function>("changed", [self](Interp&, CallArgs& args) -> Value {
            Value now = Value::MakeList(args.positional);
            if (self->has_last_ && Equals(self->last_changed_, now)) return Value::MakeBool(false);
            self->last_changed_ = now;
            self->has_last_ = true;
            return Value::MakeBool(true);
          }));
    }
    return std::nullopt;
  }

 private:
  std::shared_ptr<const ValueList> items_;
  size_t index0_ = 0;
  Value last_changed_;
  bool has_last_ = false;
};

class Macro : public Object {
 public:
  Macro(const Stmt* def, ScopePtr closure, std::string name)
      : def_(def), closure_(std::move(closure)), name_(std::move(name)) {}
  std::string TypeName() const override { return "Macro"; }
  std::string Repr() const override { return "<Macro " + py::Repr(name_) + ">"; }
  bool IsCallable() const override { return true; }
  Value Call(Interp& interp, CallArgs& args) override {
    return interp.InvokeMacro(*def_, closure_, args);
  }

 private:
  const Stmt* def_;
  ScopePtr closure_;
  std::string name_;
};

// jinja2's object_type_repr: "None", or "<type> object".
std::string TypeObjectName(const Value& v) {
  if (v.is_none()) return "None";
  return TypeName(v) + " object";
}

Value MissingAttr(const Value& obj, std::string_view name) {
  return Value::MakeUndefined(py::Repr(TypeObjectName(obj)) + " has no attribute " +
                              py::Repr(std::string(name)));
}

Value MissingElement(const Value& obj, const Value& key) {
  return Value::MakeUndefined(TypeObjectName(obj) + " has no element " + ToRepr(key));
}

// Python index into a sequence of length n; nullopt when out of range.
std::optional<size_t> NormalizeIndex(int64_t i, size_t n) {
  const auto len = static_cast<int64_t>(n);
  if (i < 0) i += len;
  if (i < 0 || i >= len) return std::nullopt;
  return static_cast<size_t>(i);
}

}  // namespace

// ---------------------------------------------------------------- rendering

Interp::CallGuard::CallGuard(Interp* i) : interp(i) {
  if (++interp->call_depth_ > interp->limits_.max_call_depth) {
    --interp->call_depth_;
    throw Error("maximum recursion depth exceeded");
  }
}

Interp::CallGuard::~CallGuard() {
  --interp->call_depth_;
}

namespace {
// Drops entries only the tracker still holds (they cannot be in a cycle), so a template that
// creates objects in a long loop does not keep them all alive until the render ends.
template <class T>
void Prune(std::vector<std::shared_ptr<T>>* tracked, size_t* prune_at) {
  if (tracked->size() < *prune_at) return;
  tracked->erase(std::remove_if(tracked->begin(), tracked->end(),
                                [](const std::shared_ptr<T>& p) { return p.use_count() == 1; }),
                 tracked->end());
  *prune_at = std::max<size_t>(1024, 2 * tracked->size());
}
}  // namespace

void Interp::Track(const ScopePtr& scope) {
  tracked_scopes_.push_back(scope);
  Prune(&tracked_scopes_, &prune_scopes_at_);
}

void Interp::Track(const std::shared_ptr<Namespace>& ns) {
  tracked_namespaces_.push_back(ns);
  Prune(&tracked_namespaces_, &prune_namespaces_at_);
}

void Interp::Step() {
  if (++steps_ > limits_.max_steps) throw Error("template exceeded its step limit");
}

void Interp::Append(std::string& out, const Value& v) {
  AppendStr(out, v);
  if (out.size() > limits_.max_output_bytes) throw Error("template output exceeded its size limit");
}

std::string Interp::Render(const StmtList& body, const ScopePtr& root) {
  struct Cleanup {
    Interp* interp;
    ~Cleanup() {
      for (auto& s : interp->tracked_scopes_) s->Clear();
      for (auto& ns : interp->tracked_namespaces_) ns->Clear();
      interp->tracked_scopes_.clear();
      interp->tracked_namespaces_.clear();
    }
  } cleanup{this};
  std::string out;
  Exec(body, root, out);
  return out;
}

Interp::Flow Interp::Exec(const StmtList& body, const ScopePtr& scope, std::string& out) {
  for (const auto& sp : body) {
    const Stmt& s = *sp;
    Step();
    switch (s.kind) {
      case StmtKind::kText:
        out += s.text;
        if (out.size() > limits_.max_output_bytes) {
          throw Error("template output exceeded its size limit");
        }
        break;
      case StmtKind::kOutput:
        Append(out, Eval(*s.expr, scope));
        break;
      case StmtKind::kIf: {
        const StmtList* chosen = &s.else_body;
        for (const auto& [cond, branch] : s.branches) {
          if (Eval(*cond, scope).Truthy()) {
            chosen = &branch;
            break;
          }
        }
        const Flow f = Exec(*chosen, scope, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kFor:
        ExecFor(s, scope, out);
        break;
      case StmtKind::kSet:
        Assign(s.target, Eval(*s.expr, scope), scope);
        break;
      case StmtKind::kSetBlock: {
        std::string text;
        Exec(s.body, std::make_shared<Scope>(scope), text);
        Value v = Value::MakeString(std::move(text));
        if (s.expr) v = ApplyFilterChain(*s.expr, v, scope);
        Assign(s.target, v, scope);
        break;
      }
      case StmtKind::kMacro:
        scope->Set(s.name, Value::MakeObject(std::make_shared<Macro>(&s, scope, s.name)));
        Track(scope);
        break;
      case StmtKind::kCallBlock: {
        const Expr& call = *s.expr;
        CallArgs args;
        EvalArgs(call, 1, scope, &args);
        args.keywords.emplace_back("caller",
                                   Value::MakeObject(std::make_shared<Macro>(&s, scope, "caller")));
        Value callee = Eval(*call.args[0], scope);
        Append(out, Call(callee, args));
        break;
      }
      case StmtKind::kFilterBlock: {
        std::string text;
        Exec(s.body, std::make_shared<Scope>(scope), text);
        Append(out, ApplyFilterChain(*s.expr, Value::MakeString(std::move(text)), scope));
        break;
      }
      case StmtKind::kWith: {
        auto inner = std::make_shared<Scope>(scope);
        std::vector<Value> values;
        for (const auto& [target, expr] : s.assignments) values.push_back(Eval(*expr, scope));
        for (size_t i = 0; i < values.size(); ++i) Assign(s.assignments[i].first, values[i], inner);
        const Flow f = Exec(s.body, inner, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kScope: {
        const Flow f = Exec(s.body, scope, out);
        if (f != Flow::kNormal) return f;
        break;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
    }
  }
  return Flow::kNormal;
}

Interp::Flow Interp::ExecFor(const Stmt& s, const ScopePtr& scope, std::string& out) {
  ValueList items = Iterate(Eval(*s.expr, scope));
  if (s.cond) {
    ValueList kept;
    for (const Value& item : items) {
      Step();
      auto test_scope = std::make_shared<Scope>(scope);
      Assign(s.target, item, test_scope);
      if (Eval(*s.cond, test_scope).Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Exec(s.else_body, std::make_shared<Scope>(scope), out);
    return Flow::kNormal;
  }
  auto shared_items = std::make_shared<const ValueList>(std::move(items));
  auto loop = std::make_shared<LoopObject>(shared_items);
  const Value loop_value = Value::MakeObject(loop);
  for (size_t i = 0; i < shared_items->size(); ++i) {
    Step();
    loop->set_index(i);
    auto iter_scope = std::make_shared<Scope>(scope);
    Assign(s.target, (*shared_items)[i], iter_scope);
    iter_scope->Set("loop", loop_value);
    if (Exec(s.body, iter_scope, out) == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Interp::Assign(const Target& t, const Value& v, const ScopePtr& scope) {
  switch (t.kind) {
    case Target::Kind::kName:
      scope->Set(t.name, v);
      return;
    case Target::Kind::kNamespaceAttr: {
      const Value* ns = scope->Lookup(t.name);
      if (ns == nullptr || !ns->is_object() || !ns->object()->SetAttr(t.attr, v)) {
        throw Error("cannot assign attribute on non-namespace object");
      }
      return;
    }
    case Target::Kind::kTuple: {
      const ValueList parts = Iterate(v);
      if (parts.size() > t.items.size()) {
        throw Error("too many values to unpack (expected " + std::to_string(t.items.size()) + ")");
      }
      if (parts.size() < t.items.size()) {
        throw Error("not enough values to unpack (expected " + std::to_string(t.items.size()) +
                    ", got " + std::to_string(parts.size()) + ")");
      }
      for (size_t i = 0; i < parts.size(); ++i) Assign(t.items[i], parts[i], scope);
      return;
    }
  }
}

Value Interp::InvokeMacro(const Stmt& m, const ScopePtr& closure, CallArgs& args) {
  CallGuard guard(this);
  Step();
  auto scope = std::make_shared<Scope>(closure);
  const size_t n_params = m.params.size();
  const size_t n_pos = std::min(n_params, args.positional.size());
  std::vector<bool> provided(n_params, false);
  for (size_t i = 0; i < n_pos; ++i) {
    scope->Set(m.params[i], args.positional[i]);
    provided[i] = true;
  }
  auto& kw = args.keywords;
  for (size_t i = n_pos; i < n_params; ++i) {
    auto it =
        std::find_if(kw.begin(), kw.end(), [&](const auto& p) { return p.first == m.params[i]; });
    if (it != kw.end()) {
      scope->Set(m.params[i], it->second);
      provided[i] = true;
      kw.erase(it);
    }
  }
  for (size_t i = 0; i < n_params; ++i) {
    if (provided[i]) continue;
    if (m.defaults[i]) {
      scope->Set(m.params[i], Eval(*m.defaults[i], scope));
    } else {
      scope->Set(m.params[i],
                 Value::MakeUndefined("parameter " + py::Repr(m.params[i]) + " was not provided"));
    }
  }
  const std::string name = m.kind == StmtKind::kMacro ? m.name : "caller";
  if (m.uses_caller) {
    auto it = std::find_if(kw.begin(), kw.end(), [](const auto& p) { return p.first == "caller"; });
    if (it != kw.end()) {
      scope->Set("caller", it->second);
      kw.erase(it);
    } else {
      scope->Set("caller", Value::MakeUndefined("No caller defined"));
    }
  }
  if (m.uses_kwargs) {
    Dict d;
    for (auto& [k, v] : kw) d.Set(Value::MakeString(k), v);
    scope->Set("kwargs", Value::MakeDict(std::move(d)));
  } else if (!kw.empty()) {
    if (std::any_of(kw.begin(), kw.end(), [](const auto& p) { return p.first == "caller"; })) {
      throw Error("macro " + py::Repr(name) +
                  " was invoked with two values for the special "
                  "'caller' argument. This is most likely a bug.");
    }
    throw Error("macro " + py::Repr(name) + " takes no keyword argument " +
                py::Repr(kw.front().first));
  }
  if (m.uses_varargs) {
    ValueList extra;
    for (size_t i = n_params; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
    scope->Set("varargs", Value::MakeTuple(std::move(extra)));
  } else if (args.positional.size() > n_params) {
    throw Error("macro " + py::Repr(name) + " takes not more than " + std::to_string(n_params) +
                " argument(s)");
  }
  std::string out;
  Exec(m.body, scope, out);
  return Value::MakeString(std::move(out));
}

// ---------------------------------------------------------------- expressions

Value Interp::Eval(const Expr& e, const ScopePtr& scope) {
  switch (e.kind) {
    case ExprKind::kLiteral:
      return e.literal;
    case ExprKind::kName: {
      const Value* v = scope->Lookup(e.name);
      if (v != nullptr) return *v;
      return Value::MakeUndefined(py::Repr(e.name) + " is undefined");
    }
    case ExprKind::kList:
    case ExprKind::kTuple: {
      ValueList items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(Eval(*a, scope));
      return e.kind == ExprKind::kList ? Value::MakeList(std::move(items))
                                       : Value::MakeTuple(std::move(items));
    }
    case ExprKind::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value key = Eval(*e.args[i], scope);
        if (key.is_list() || key.is_dict() || key.is_undefined()) {
          throw Error("unhashable type: " + py::Repr(TypeName(key)));
        }
        d.Set(std::move(key), Eval(*e.args[i + 1], scope));
      }
      return Value::MakeDict(std::move(d));
    }
    case ExprKind::kGetAttr:
      return GetAttr(Eval(*e.args[0], scope), e.name);
    case ExprKind::kGetItem:
      return GetItem(Eval(*e.args[0], scope), Eval(*e.args[1], scope));
    case ExprKind::kSlice:
      return EvalSlice(e, scope);
    case ExprKind::kCall:
      return EvalCall(e, scope);
    case ExprKind::kFilter: {
      const Value subject = Eval(*e.args[0], scope);
      CallArgs args;
      EvalArgs(e, 1, scope, &args);
      if (e.filter == nullptr) throw Error("No filter named " + py::Repr(e.name) + " found.");
      return e.filter(*this, subject, args);
    }
    case ExprKind::kTest: {
      const Value subject = Eval(*e.args[0], scope);
      CallArgs args;
      EvalArgs(e, 1, scope, &args);
      if (e.test == nullptr) throw Error("No test named " + py::Repr(e.name) + " found.");
      return Value::MakeBool(e.test(*this, subject, args));
    }
    case ExprKind::kUnary: {
      const Value v = Eval(*e.args[0], scope);
      if (v.is_undefined()) ThrowUndefined(v);
      if (v.is_integral()) {
        const int64_t i = v.int_value();
        if (e.op == Op::kPos) return Value::MakeInt(i);
        if (i == INT64_MIN) throw Error("integer overflow");
        return Value::MakeInt(-i);
      }
      if (v.is_float())
        return Value::MakeFloat(e.op == Op::kNeg ? -v.float_value() : v.float_value());
      throw Error(std::string("bad operand type for unary ") + (e.op == Op::kNeg ? "-" : "+") +
                  ": " + py::Repr(TypeName(v)));
    }
    case ExprKind::kBinary: {
      const Value a = Eval(*e.args[0], scope);
      const Value b = Eval(*e.args[1], scope);
      return BinaryOp(e.op, a, b);
    }
    case ExprKind::kCompare:
      return EvalCompare(e, scope);
    case ExprKind::kAnd: {
      Value a = Eval(*e.args[0], scope);
      return a.Truthy() ? Eval(*e.args[1], scope) : a;
    }
    case ExprKind::kOr: {
      Value a = Eval(*e.args[0], scope);
      return a.Truthy() ? a : Eval(*e.args[1], scope);
    }
    case ExprKind::kNot:
      return Value::MakeBool(!Eval(*e.args[0], scope).Truthy());
    case ExprKind::kCondExpr:
      if (Eval(*e.args[0], scope).Truthy()) return Eval(*e.args[1], scope);
      if (e.args[2]) return Eval(*e.args[2], scope);
      return Value::MakeUndefined("the inline if-expression on line " + std::to_string(e.line) +
                                  " evaluated to false and no else section was defined.");
    case ExprKind::kBlockSubject:
      if (block_subjects_.empty()) throw Error("filter block without a body");
      return block_subjects_.back();
  }
  throw Error("unknown expression");
}

Value Interp::ApplyFilterChain(const Expr& chain, const Value& subject, const ScopePtr& scope) {
  block_subjects_.push_back(subject);
  try {
    Value v = Eval(chain, scope);
    block_subjects_.pop_back();
    return v;
  } catch (...) {
    block_subjects_.pop_back();
    throw;
  }
}

void Interp::EvalArgs(const Expr& e, size_t first, const ScopePtr& scope, CallArgs* out) {
  for (size_t i = first; i < e.args.size(); ++i) out->positional.push_back(Eval(*e.args[i], scope));
  for (const auto& [name, expr] : e.kwargs) {
    Value v = Eval(*expr, scope);
    if (name == "*") {
      for (Value& item : Iterate(v)) out->positional.push_back(std::move(item));
    } else if (name == "**") {
      if (!v.is_dict()) throw Error("argument after ** must be a mapping, not " + TypeName(v));
      for (const auto& [k, val] : v.dict().entries()) {
        if (!k.is_string()) throw Error("keywords must be strings");
        out->keywords.emplace_back(k.str(), val);
      }
    } else {
      out->keywords.emplace_back(name, std::move(v));
    }
  }
}

Value Interp::EvalCall(const Expr& e, const ScopePtr& scope) {
  const Value callee = Eval(*e.args[0], scope);
  CallArgs args;
  EvalArgs(e, 1, scope, &args);
  return Call(callee, args);
}

Value Interp::Call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) ThrowUndefined(callee);
  if (!callee.is_object() || !callee.object()->IsCallable()) {
    throw Error(py::Repr(TypeName(callee)) + " object is not callable");
  }
  Step();
  return callee.object()->Call(*this, args);
}

Value Interp::CallFilter(std::string_view name, const Value& subject, CallArgs& args) {
  FilterFn f = FindFilter(name);
  if (f == nullptr) throw Error("No filter named " + py::Repr(std::string(name)) + ".");
  CallGuard guard(this);
  return f(*this, subject, args);
}

bool Interp::CallTest(std::string_view name, const Value& subject, CallArgs& args) {
  TestFn t = FindTest(name);
  if (t == nullptr) throw Error("No test named " + py::Repr(std::string(name)) + ".");
  CallGuard guard(this);
  return t(*this, subject, args);
}

Value Interp::EvalCompare(const Expr& e, const ScopePtr& scope) {
  Value left = Eval(*e.args[0], scope);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = Eval(*e.args[i + 1], scope);
    if (!CompareOp(e.ops[i], left, right)) return Value::MakeBool(false);
    left = std::move(right);
  }
  return Value::MakeBool(true);
}

Value Interp::EvalSlice(const Expr& e, const ScopePtr& scope) {
  const Value obj = Eval(*e.args[0], scope);
  std::optional<int64_t> bounds[3];
  bool valid = true;
  for (int k = 0; k < 3; ++k) {
    if (!e.args[k + 1]) continue;
    const Value b = Eval(*e.args[k + 1], scope);
    if (b.is_none()) continue;
    if (!b.is_integral()) {
      valid = false;
      continue;
    }
    bounds[k] = b.int_value();
  }
  if (obj.is_undefined()) ThrowUndefined(obj);
  if (!valid || !(obj.is_string() || obj.is_list() || obj.is_tuple())) {
    return Value::MakeUndefined(TypeObjectName(obj) + " has no element slice");
  }
  const int64_t step = bounds[2].value_or(1);
  if (step == 0) throw Error("slice step cannot be zero");
  std::u32string chars;
  const ValueList* list = nullptr;
  int64_t n = 0;
  if (obj.is_string()) {
    chars = py::Decode(obj.str());
    n = static_cast<int64_t>(chars.size());
  } else {
    list = &obj.items();
    n = static_cast<int64_t>(list->size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t def_pos, int64_t def_neg) {
    if (!v) return step > 0 ? def_pos : def_neg;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= n) {
      x = step < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t start = adjust(bounds[0], 0, n - 1);
  const int64_t stop = adjust(bounds[1], n, -1);
  std::vector<int64_t> idx;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) idx.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) idx.push_back(i);
  }
  if (obj.is_string()) {
    std::u32string r;
    for (int64_t i : idx) r.push_back(chars[static_cast<size_t>(i)]);
    return Value::MakeString(py::Encode(r));
  }
  ValueList r;
  for (int64_t i : idx) r.push_back((*list)[static_cast<size_t>(i)]);
  return obj.is_list() ? Value::MakeList(std::move(r)) : Value::MakeTuple(std::move(r));
}

// ---------------------------------------------------------------- attribute access

Value Interp::GetAttrOnly(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  if (obj.is_object()) {
    if (auto v = obj.object()->GetAttr(name)) return *v;
    return MissingAttr(obj, name);
  }
  if (auto m = FindMethod(obj, name)) return *m;
  return MissingAttr(obj, name);
}

Value Interp::GetAttr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  if (obj.is_dict()) {
    if (auto m = FindMethod(obj, name)) return *m;
    if (const Value* v = obj.dict().FindString(name)) return *v;
    return MissingAttr(obj, name);
  }
  return GetAttrOnly(obj, name);
}

Value Interp::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) ThrowUndefined(obj);
  switch (obj.kind()) {
    case Kind::kDict:
      if (key.is_list() || key.is_dict()) break;
      if (const Value* v = obj.dict().Find(key)) return *v;
      break;
    case Kind::kList:
    case Kind::kTuple:
      if (key.is_integral()) {
        if (auto i = NormalizeIndex(key.int_value(), obj.items().size())) return obj.items()[*i];
        return MissingElement(obj, key);
      }
      break;
    case Kind::kString:
      if (key.is_integral()) {
        const std::u32string chars = py::Decode(obj.str());
        if (auto i = NormalizeIndex(key.int_value(), chars.size())) {
          return Value::MakeString(py::Encode(chars.substr(*i, 1)));
        }
        return MissingElement(obj, key);
      }
      break;
    case Kind::kObject:
      if (key.is_string()) {
        if (auto v = obj.object()->GetAttr(key.str())) return *v;
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.is_object()) return MissingAttr(obj, key.str());
    if (auto m = FindMethod(obj, key.str())) return *m;
    return MissingAttr(obj, key.str());
  }
  return MissingElement(obj, key);
}

ValueList Interp::Iterate(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator:
      return v.items();
    case Kind::kDict: {
      ValueList keys;
      keys.reserve(v.dict().size());
      for (const auto& [k, val] : v.dict().entries()) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      const std::string& s = v.str();
      size_t pos = 0;
      while (pos < s.size()) {
        const size_t n = py::CharBytes(s, pos);
        chars.push_back(Value::MakeString(s.substr(pos, n)));
        pos += n;
      }
      return chars;
    }
    default:
      throw Error(py::Repr(TypeName(v)) + " object is not iterable");
  }
}

}  // namespace kestrel::jinja
