// Tests (`x is defined`), global functions and the Python argument-binding helpers.
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <ctime>
#include <unordered_map>

#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

// ---------------------------------------------------------------- argument binding

std::vector<Value> BindArgs(std::string_view fn, CallArgs& args,
                            std::initializer_list<Param> params) {
  const std::string name(fn);
  if (args.positional.size() > params.size()) {
    throw Error(name + "() takes at most " + std::to_string(params.size()) + " argument(s) (" +
                std::to_string(args.positional.size()) + " given)");
  }
  std::vector<Value> out(params.size());
  std::vector<bool> set(params.size(), false);
  for (size_t i = 0; i < args.positional.size(); ++i) {
    out[i] = args.positional[i];
    set[i] = true;
  }
  for (const auto& [key, value] : args.keywords) {
    size_t i = 0;
    for (const Param& p : params) {
      if (p.name == key) break;
      ++i;
    }
    if (i == params.size()) {
      throw Error(name + "() got an unexpected keyword argument " + py::Repr(key));
    }
    if (set[i]) throw Error(name + "() got multiple values for argument " + py::Repr(key));
    out[i] = value;
    set[i] = true;
  }
  size_t i = 0;
  for (const Param& p : params) {
    if (!set[i]) {
      if (!p.default_value) {
        throw Error(name + "() missing required argument " + py::Repr(std::string(p.name)));
      }
      out[i] = *p.default_value;
    }
    ++i;
  }
  return out;
}

int64_t ToInt(const Value& v, std::string_view what) {
  if (v.is_integral()) return v.int_value();
  if (v.is_undefined()) ThrowUndefined(v);
  throw Error(std::string(what) + ": " + py::Repr(TypeName(v)) +
              " object cannot be interpreted as an integer");
}

const std::string& ToString(const Value& v, std::string_view what) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) ThrowUndefined(v);
  throw Error(std::string(what) + ": must be str, not " + TypeName(v));
}

std::optional<std::string> ToOptString(const Value& v, std::string_view what) {
  if (v.is_none()) return std::nullopt;
  return ToString(v, what);
}

// ---------------------------------------------------------------- tests

namespace {

Value Arg(Interp& /*interp*/, CallArgs& args, std::string_view test, std::string_view name) {
  auto bound = BindArgs(test, args, {{name, std::nullopt}});
  return bound[0];
}

bool Mod2Equals(Interp& interp, const Value& v, int64_t r) {
  return Equals(interp.BinaryOp(Op::kMod, v, Value::MakeInt(2)), Value::MakeInt(r));
}

bool IsIdentical(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return a.bool_value() == b.bool_value();
    case Kind::kInt:  // CPython caches small ints
      return a.int_value() == b.int_value() && a.int_value() >= -5 && a.int_value() <= 256;
    case Kind::kFloat:
      return false;
    default:
      return a.identity() == b.identity();
  }
}

template <Op kOp>
bool CompareTest(Interp& in, const Value& v, CallArgs& a) {
  return in.CompareOp(kOp, v, Arg(in, a, "compare", "b"));
}

std::unordered_map<std::string_view, TestFn> BuildTestTable() {
  return {
      {"odd",
       [](Interp& in, const Value& v, CallArgs& a) {
         BindArgs("odd", a, {});
         return Mod2Equals(in, v, 1);
       }},
      {"even",
       [](Interp& in, const Value& v, CallArgs& a) {
         BindArgs("even", a, {});
         return Mod2Equals(in, v, 0);
       }},
      {"divisibleby",
       [](Interp& in, const Value& v, CallArgs& a) {
         const Value num = Arg(in, a, "divisibleby", "num");
         return Equals(in.BinaryOp(Op::kMod, v, num), Value::MakeInt(0));
       }},
      {"defined", [](Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }},
      {"undefined", [](Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }},
      {"filter", [](Interp&, const Value& v,
                    CallArgs&) { return v.is_string() && FindFilter(v.str()) != nullptr; }},
      {"test", [](Interp&, const Value& v,
                  CallArgs&) { return v.is_string() && FindTest(v.str()) != nullptr; }},
      {"none", [](Interp&, const Value& v, CallArgs&) { return v.is_none(); }},
      {"boolean", [](Interp&, const Value& v, CallArgs&) { return v.is_bool(); }},
      {"false", [](Interp&, const Value& v, CallArgs&) { return v.is_bool() && !v.bool_value(); }},
      {"true", [](Interp&, const Value& v, CallArgs&) { return v.is_bool() && v.bool_value(); }},
      {"integer", [](Interp&, const Value& v, CallArgs&) { return v.is_int(); }},
      {"float", [](Interp&, const Value& v, CallArgs&) { return v.is_float(); }},
      {"lower", [](Interp&, const Value& v, CallArgs&) { return py::StrIsLower(ToStr(v)); }},
      {"upper", [](Interp&, const Value& v, CallArgs&) { return py::StrIsUpper(ToStr(v)); }},
      {"string", [](Interp&, const Value& v, CallArgs&) { return v.is_string(); }},
      {"mapping", [](Interp&, const Value& v, CallArgs&) { return v.is_dict(); }},
      {"number", [](Interp&, const Value& v, CallArgs&) { return v.is_number(); }},
      // Undefined defines __len__, __getitem__ and __iter__, so it passes both.
      {"sequence",
       [](Interp&, const Value& v, CallArgs&) {
         return v.is_string() || v.is_list() || v.is_tuple() || v.is_dict() || v.is_undefined();
       }},
      {"iterable",
       [](Interp&, const Value& v, CallArgs&) {
         return v.is_string() || v.has_items() || v.is_dict() || v.is_undefined();
       }},
      {"callable",
       [](Interp&, const Value& v, CallArgs&) {
         return v.is_object() &&
                (v.object()->IsCallable() || v.object()->TypeName() == "LoopContext");
       }},
      {"sameas", [](Interp& in, const Value& v,
                    CallArgs& a) { return IsIdentical(v, Arg(in, a, "sameas", "other")); }},
      {"escaped", [](Interp&, const Value&, CallArgs&) { return false; }},
      {"in", [](Interp& in, const Value& v,
                CallArgs& a) { return in.CompareOp(Op::kIn, v, Arg(in, a, "in", "seq")); }},
      {"==", CompareTest<Op::kEq>},
      {"eq", CompareTest<Op::kEq>},
      {"equalto", CompareTest<Op::kEq>},
      {"!=", CompareTest<Op::kNe>},
      {"ne", CompareTest<Op::kNe>},
      {">", CompareTest<Op::kGt>},
      {"gt", CompareTest<Op::kGt>},
      {"greaterthan", CompareTest<Op::kGt>},
      {">=", CompareTest<Op::kGe>},
      {"ge", CompareTest<Op::kGe>},
      {"<", CompareTest<Op::kLt>},
      {"lt", CompareTest<Op::kLt>},
      {"lessthan", CompareTest<Op::kLt>},
      {"<=", CompareTest<Op::kLe>},
      {"le", CompareTest<Op::kLe>},
  };
}

// ---------------------------------------------------------------- globals

constexpr int64_t kMaxRange = 100000;  // jinja2 sandbox's MAX_RANGE

Value Range(Interp&, CallArgs& args) {
  if (!args.keywords.empty()) throw Error("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) throw Error("range expected 1 to 3 arguments");
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (p.size() == 1) {
    stop = ToInt(p[0], "range");
  } else {
    start = ToInt(p[0], "range");
    stop = ToInt(p[1], "range");
    if (p.size() == 3) step = ToInt(p[2], "range");
  }
  if (step == 0) throw Error("range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      throw Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.push_back(Value::MakeInt(i));
  }
  return Value::MakeList(std::move(out));
}

void MergeInto(Dict* d, const Value& v, const char* fn) {
  if (v.is_dict()) {
    for (const auto& [k, val] : v.dict().entries()) d->Set(k, val);
    return;
  }
  if (!v.has_items()) throw Error(std::string(fn) + "(): argument must be a mapping or pairs");
  for (const Value& pair : v.items()) {
    if (!pair.has_items() || pair.items().size() != 2) {
      throw Error(std::string(fn) + "(): sequence elements must have length 2");
    }
    d->Set(pair.items()[0], pair.items()[1]);
  }
}

Value DictFn(Interp&, CallArgs& args) {
  if (args.positional.size() > 1) throw Error("dict expected at most 1 argument");
  Dict d;
  if (!args.positional.empty()) MergeInto(&d, args.positional[0], "dict");
  for (const auto& [k, v] : args.keywords) d.Set(Value::MakeString(k), v);
  return Value::MakeDict(std::move(d));
}

Value NamespaceFn(Interp& interp, CallArgs& args) {
  Dict d;
  for (const Value& p : args.positional) MergeInto(&d, p, "namespace");
  for (const auto& [k, v] : args.keywords) d.Set(Value::MakeString(k), v);
  auto ns = std::make_shared<Namespace>();
  for (const auto& [k, v] : d.entries()) ns->SetAttr(ToStr(k), v);
  interp.Track(ns);
  return Value::MakeObject(ns);
}

class Cycler : public Object {
 public:
  explicit Cycler(ValueList items) : items_(std::move(items)) {}
  std::string TypeName() const override { return "Cycler"; }
  std::string Repr() const override { return "<Cycler>"; }
  std::optional<Value> GetAttr(std::string_view name) const override {
    auto* self = const_cast<Cycler*>(this);
    if (name == "current") return items_[pos_];
    if (name == "next") {
      return Value::MakeObject(std::make_shared<Function>("next", [self](Interp&, CallArgs&) {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      }));
    }
    if (name == "reset") {
      return Value::MakeObject(std::make_shared<Function>("reset", [self](Interp&, CallArgs&) {
        self->pos_ = 0;
        return Value::MakeNone();
      }));
    }
    return std::nullopt;
  }

 private:
  ValueList items_;
  size_t pos_ = 0;
};

}  // namespace

TestFn FindTest(std::string_view name) {
  static const auto* table = new std::unordered_map<std::string_view, TestFn>(BuildTestTable());
  const auto& t = *table;
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

void AddGlobals(Scope& scope) {
  auto fn = [&scope](const std::string& name, Function::Fn f) {
    scope.Set(name, Value::MakeObject(std::make_shared<Function>(name, std::move(f))));
  };
  fn("range", Range);
  fn("dict", DictFn);
  fn("namespace", NamespaceFn);
  fn("raise_exception", [](Interp&, CallArgs& args) -> Value {
    auto a = BindArgs("raise_exception", args, {{"message", std::nullopt}});
    throw RaisedError(ToStr(a[0]));
  });
  fn("strftime_now", [](Interp&, CallArgs& args) -> Value {
    auto a = BindArgs("strftime_now", args, {{"format", std::nullopt}});
    const std::string& format = ToString(a[0], "strftime_now");
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &tm);
    return Value::MakeString(std::string(buf, n));
  });
  fn("joiner", [](Interp&, CallArgs& args) -> Value {
    auto a = BindArgs("joiner", args, {{"sep", Value::MakeString(", ")}});
    auto used = std::make_shared<bool>(false);
    const std::string sep = ToStr(a[0]);
    return Value::MakeObject(std::make_shared<Function>("joiner", [used, sep](Interp&, CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::MakeString("");
      }
      return Value::MakeString(sep);
    }));
  });
  fn("cycler", [](Interp&, CallArgs& args) -> Value {
    if (args.positional.empty()) throw Error("at least one item has to be provided");
    return Value::MakeObject(std::make_shared<Cycler>(args.positional));
  });
}

}  // namespace kestrel::jinja
