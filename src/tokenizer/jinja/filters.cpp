// jinja2's builtin filters, plus transformers' tojson (json.dumps without HTML escaping).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <unordered_map>

#include "core/html_escape.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/json.h"
#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

namespace {

Value Str(std::string s) {
  return Value::MakeString(std::move(s));
}
Value None() {
  return Value::MakeNone();
}
Value False() {
  return Value::MakeBool(false);
}

// str() as jinja2's soft_str applies it (Undefined -> "").
std::string SoftStr(const Value& v) {
  return ToStr(v);
}

// make_attrgetter: "a.b.0" looks up a, then b, then item 0, with getitem semantics.
class AttrGetter {
 public:
  AttrGetter(const Value& attribute, bool lower, Value default_value)
      : lower_(lower), default_(std::move(default_value)) {
    if (attribute.is_none()) return;
    if (!attribute.is_string()) {
      parts_.push_back(attribute);
      return;
    }
    for (const std::string& part : py::Split(attribute.str(), std::string("."), -1)) {
      const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                       [](char c) { return c >= '0' && c <= '9'; });
      parts_.push_back(digits ? Value::MakeInt(std::stoll(part)) : Str(part));
    }
  }

  Value operator()(Interp& interp, Value item) const {
    for (const Value& part : parts_) {
      item = interp.GetItem(item, part);
      if (!default_.is_none() && item.is_undefined()) item = default_;
    }
    if (lower_ && item.is_string()) return Str(py::Lower(item.str()));
    return item;
  }

 private:
  std::vector<Value> parts_;
  bool lower_;
  Value default_;
};

// Sort keys for sort / dictsort / min / max: a comma list of attributes compares as a list.
std::vector<AttrGetter> MultiGetter(const Value& attribute, bool lower) {
  std::vector<AttrGetter> getters;
  if (attribute.is_string() && attribute.str().find(',') != std::string::npos) {
    for (const std::string& a : py::Split(attribute.str(), std::string(","), -1)) {
      getters.emplace_back(Str(a), lower, None());
    }
  } else {
    getters.emplace_back(attribute, lower, None());
  }
  return getters;
}

Value KeyOf(Interp& interp, const std::vector<AttrGetter>& getters, const Value& item) {
  if (getters.size() == 1) return getters[0](interp, item);
  ValueList keys;
  for (const auto& g : getters) keys.push_back(g(interp, item));
  return Value::MakeList(std::move(keys));
}

ValueList SortedBy(ValueList items, std::vector<Value> keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return reverse ? Less(keys[b], keys[a]) : Less(keys[a], keys[b]);
  });
  ValueList out;
  out.reserve(items.size());
  for (size_t i : order) out.push_back(std::move(items[i]));
  return out;
}

int64_t Len(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return 0;
    case Kind::kString:
      return static_cast<int64_t>(py::Length(v.str()));
    case Kind::kList:
    case Kind::kTuple:
      return static_cast<int64_t>(v.items().size());
    case Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    default:
      throw Error("object of type " + py::Repr(TypeName(v)) + " has no len()");
  }
}

// ---------------------------------------------------------------- filters

Value FAbs(Interp&, const Value& v, CallArgs& a) {
  BindArgs("abs", a, {});
  if (v.is_integral()) {
    if (v.int_value() == INT64_MIN) throw Error("integer overflow");
    return Value::MakeInt(std::abs(v.int_value()));
  }
  if (v.is_float()) return Value::MakeFloat(std::fabs(v.float_value()));
  if (v.is_undefined()) ThrowUndefined(v);
  throw Error("bad operand type for abs(): " + py::Repr(TypeName(v)));
}

Value FAttr(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("attr", a, {{"name", std::nullopt}});
  return in.GetAttrOnly(v, ToString(b[0], "attr"));
}

Value FBatch(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("batch", a, {{"linecount", std::nullopt}, {"fill_with", None()}});
  const int64_t n = ToInt(b[0], "batch");
  if (n <= 0) throw Error("batch size must be positive");
  ValueList out;
  ValueList tmp;
  for (const Value& item : in.Iterate(v)) {
    if (static_cast<int64_t>(tmp.size()) == n) {
      out.push_back(Value::MakeList(std::move(tmp)));
      tmp.clear();
    }
    tmp.push_back(item);
  }
  if (!tmp.empty()) {
    if (!b[1].is_none()) {
      while (static_cast<int64_t>(tmp.size()) < n) tmp.push_back(b[1]);
    }
    out.push_back(Value::MakeList(std::move(tmp)));
  }
  return Value::MakeIterator(std::move(out));
}

Value FCapitalize(Interp&, const Value& v, CallArgs& a) {
  BindArgs("capitalize", a, {});
  return Str(py::Capitalize(SoftStr(v)));
}

Value FCenter(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("center", a, {{"width", Value::MakeInt(80)}});
  return Str(py::Center(SoftStr(v), ToInt(b[0], "center"), ' '));
}

Value FLength(Interp&, const Value& v, CallArgs& a) {
  BindArgs("length", a, {});
  return Value::MakeInt(Len(v));
}

Value FDefault(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("default", a, {{"default_value", Str("")}, {"boolean", False()}});
  if (v.is_undefined() || (b[1].Truthy() && !v.Truthy())) return b[0];
  return v;
}

Value FDictsort(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("dictsort", a,
                    {{"case_sensitive", False()}, {"by", Str("key")}, {"reverse", False()}});
  const std::string by = ToStr(b[1]);
  if (by != "key" && by != "value") throw Error("You can only sort by either \"key\" or \"value\"");
  if (!v.is_dict()) {
    if (v.is_undefined()) ThrowUndefined(v);
    throw Error(py::Repr(TypeName(v)) + " object has no attribute 'items'");
  }
  const size_t pos = by == "key" ? 0 : 1;
  ValueList items;
  std::vector<Value> keys;
  for (const auto& [k, val] : v.dict().entries()) {
    items.push_back(Value::MakeTuple({k, val}));
    Value key = pos == 0 ? k : val;
    if (!b[0].Truthy() && key.is_string()) key = Str(py::Lower(key.str()));
    keys.push_back(std::move(key));
  }
  return Value::MakeList(SortedBy(std::move(items), std::move(keys), b[2].Truthy()));
}

Value FEscape(Interp&, const Value& v, CallArgs& a) {
  BindArgs("escape", a, {});
  return Str(HtmlEscape(SoftStr(v)));
}

Value FFirst(Interp& in, const Value& v, CallArgs& a) {
  BindArgs("first", a, {});
  ValueList items = in.Iterate(v);
  if (items.empty()) return Value::MakeUndefined("No first item, sequence was empty.");
  return items.front();
}

Value FLast(Interp& in, const Value& v, CallArgs& a) {
  BindArgs("last", a, {});
  if (v.is_iterator()) throw Error("'generator' object is not reversible");
  ValueList items = in.Iterate(v);
  if (items.empty()) return Value::MakeUndefined("No last item, sequence was empty.");
  return items.back();
}

Value FFloat(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("float", a, {{"default", Value::MakeFloat(0.0)}});
  if (v.is_undefined()) ThrowUndefined(v);
  if (v.is_number()) return Value::MakeFloat(v.AsDouble());
  if (v.is_string()) {
    if (auto d = py::ParseFloat(v.str())) return Value::MakeFloat(*d);
  }
  return b[0];
}

Value FFormat(Interp&, const Value& v, CallArgs& a) {
  if (!a.keywords.empty()) {
    Dict d;
    for (const auto& [k, val] : a.keywords) d.Set(Str(k), val);
    return Str(PercentFormat(SoftStr(v), Value::MakeDict(std::move(d))));
  }
  return Str(PercentFormat(SoftStr(v), Value::MakeTuple(a.positional)));
}

Value FIndent(Interp&, const Value& v, CallArgs& a) {
  auto b =
      BindArgs("indent", a, {{"width", Value::MakeInt(4)}, {"first", False()}, {"blank", False()}});
  if (v.is_undefined()) ThrowUndefined(v);
  if (!v.is_string())
    throw Error("unsupported operand type(s) for +=: " + py::Repr(TypeName(v)) + " and 'str'");
  const std::string indention =
      b[0].is_string()
          ? b[0].str()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, ToInt(b[0], "indent"))), ' ');
  const std::vector<std::string> lines = py::SplitLines(v.str() + "\n", false);
  std::string rv;
  if (b[2].Truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
    }
  }
  if (b[1].Truthy()) rv = indention + rv;
  return Str(std::move(rv));
}

Value FInt(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("int", a, {{"default", Value::MakeInt(0)}, {"base", Value::MakeInt(10)}});
  if (v.is_undefined()) ThrowUndefined(v);
  if (v.is_integral()) return Value::MakeInt(v.int_value());
  if (v.is_float()) {
    const double d = v.float_value();
    if (std::isnan(d)) return b[0];
    if (std::isinf(d)) throw Error("cannot convert float infinity to integer");
    if (std::fabs(d) >= 9.2e18) throw Error("integer overflow");
    return Value::MakeInt(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    if (auto i = py::ParseInt(v.str(), static_cast<int>(ToInt(b[1], "int"))))
      return Value::MakeInt(*i);
    if (auto d = py::ParseFloat(v.str())) {
      if (std::isnan(*d)) return b[0];
      if (std::isinf(*d)) throw Error("cannot convert float infinity to integer");
      if (std::fabs(*d) >= 9.2e18) throw Error("integer overflow");
      return Value::MakeInt(static_cast<int64_t>(*d));
    }
  }
  return b[0];
}

Value FItems(Interp&, const Value& v, CallArgs& a) {
  BindArgs("items", a, {});
  if (v.is_undefined()) return Value::MakeIterator({});
  if (!v.is_dict()) throw Error("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, val] : v.dict().entries()) out.push_back(Value::MakeTuple({k, val}));
  return Value::MakeIterator(std::move(out));
}

Value FJoin(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("join", a, {{"d", Str("")}, {"attribute", None()}});
  const std::string sep = SoftStr(b[0]);
  std::string out;
  bool first = true;
  const AttrGetter getter(b[1], false, None());
  for (const Value& item : in.Iterate(v)) {
    if (!first) out += sep;
    first = false;
    AppendStr(out, b[1].is_none() ? item : getter(in, item));
  }
  return Str(std::move(out));
}

Value FList(Interp& in, const Value& v, CallArgs& a) {
  BindArgs("list", a, {});
  return Value::MakeList(in.Iterate(v));
}

Value FLower(Interp&, const Value& v, CallArgs& a) {
  BindArgs("lower", a, {});
  return Str(py::Lower(SoftStr(v)));
}

Value FUpper(Interp&, const Value& v, CallArgs& a) {
  BindArgs("upper", a, {});
  return Str(py::Upper(SoftStr(v)));
}

Value FMap(Interp& in, const Value& v, CallArgs& a) {
  ValueList out;
  const bool by_attribute =
      a.positional.empty() && std::any_of(a.keywords.begin(), a.keywords.end(),
                                          [](const auto& kv) { return kv.first == "attribute"; });
  if (by_attribute) {
    auto b = BindArgs("map", a, {{"attribute", std::nullopt}, {"default", None()}});
    const AttrGetter getter(b[0], false, b[1]);
    for (const Value& item : in.Iterate(v)) out.push_back(getter(in, item));
    return Value::MakeIterator(std::move(out));
  }
  if (a.positional.empty()) throw Error("map requires a filter argument");
  const std::string name = ToString(a.positional[0], "map");
  CallArgs rest;
  rest.positional.assign(a.positional.begin() + 1, a.positional.end());
  rest.keywords = a.keywords;
  for (const Value& item : in.Iterate(v)) {
    CallArgs call = rest;
    out.push_back(in.CallFilter(name, item, call));
  }
  return Value::MakeIterator(std::move(out));
}

Value MinMax(Interp& in, const Value& v, CallArgs& a, bool is_max) {
  auto b =
      BindArgs(is_max ? "max" : "min", a, {{"case_sensitive", False()}, {"attribute", None()}});
  const ValueList items = in.Iterate(v);
  if (items.empty()) return Value::MakeUndefined("No aggregated item, sequence was empty.");
  const AttrGetter getter(b[1], !b[0].Truthy(), None());
  size_t best = 0;
  Value best_key = getter(in, items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value key = getter(in, items[i]);
    if (is_max ? Less(best_key, key) : Less(key, best_key)) {
      best = i;
      best_key = std::move(key);
    }
  }
  return items[best];
}

Value FMax(Interp& in, const Value& v, CallArgs& a) {
  return MinMax(in, v, a, true);
}
Value FMin(Interp& in, const Value& v, CallArgs& a) {
  return MinMax(in, v, a, false);
}

Value SelectOrReject(Interp& in, const Value& v, CallArgs& a, bool select, bool by_attr) {
  size_t off = 0;
  std::optional<AttrGetter> getter;
  if (by_attr) {
    if (a.positional.empty()) throw Error("Missing parameter for attribute name");
    getter.emplace(a.positional[0], false, None());
    off = 1;
  }
  std::optional<std::string> test;
  CallArgs test_args;
  if (a.positional.size() > off) {
    test = ToString(a.positional[off], "select");
    test_args.positional.assign(a.positional.begin() + static_cast<long>(off) + 1,
                                a.positional.end());
    test_args.keywords = a.keywords;
  }
  ValueList out;
  for (const Value& item : in.Iterate(v)) {
    const Value subject = getter ? (*getter)(in, item) : item;
    bool ok;
    if (test) {
      CallArgs call = test_args;
      ok = in.CallTest(*test, subject, call);
    } else {
      ok = subject.Truthy();
    }
    if (ok == select) out.push_back(item);
  }
  return Value::MakeIterator(std::move(out));
}

Value FSelect(Interp& in, const Value& v, CallArgs& a) {
  return SelectOrReject(in, v, a, true, false);
}
Value FReject(Interp& in, const Value& v, CallArgs& a) {
  return SelectOrReject(in, v, a, false, false);
}
Value FSelectAttr(Interp& in, const Value& v, CallArgs& a) {
  return SelectOrReject(in, v, a, true, true);
}
Value FRejectAttr(Interp& in, const Value& v, CallArgs& a) {
  return SelectOrReject(in, v, a, false, true);
}

Value FReplace(Interp&, const Value& v, CallArgs& a) {
  auto b =
      BindArgs("replace", a, {{"old", std::nullopt}, {"new", std::nullopt}, {"count", None()}});
  const int64_t count = b[2].is_none() ? -1 : ToInt(b[2], "replace");
  return Str(py::Replace(SoftStr(v), SoftStr(b[0]), SoftStr(b[1]), count));
}

Value FReverse(Interp& in, const Value& v, CallArgs& a) {
  BindArgs("reverse", a, {});
  if (v.is_string()) {
    std::u32string u = py::Decode(v.str());
    std::reverse(u.begin(), u.end());
    return Str(py::Encode(u));
  }
  if (v.is_undefined() || v.has_items() || v.is_dict()) {
    ValueList items = in.Iterate(v);
    std::reverse(items.begin(), items.end());
    return v.is_iterator() ? Value::MakeList(std::move(items))
                           : Value::MakeIterator(std::move(items));
  }
  throw Error("argument must be iterable");
}

double RoundHalfEven(double x, int64_t ndigits) {
  if (!std::isfinite(x) || ndigits > 300) return x;
  if (ndigits >= 0) {
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(ndigits), x);
    return std::strtod(buf, nullptr);
  }
  const double scale = std::pow(10.0, static_cast<double>(-ndigits));
  return std::nearbyint(x / scale) * scale;
}

Value FRound(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("round", a, {{"precision", Value::MakeInt(0)}, {"method", Str("common")}});
  const std::string method = ToStr(b[1]);
  if (method != "common" && method != "ceil" && method != "floor") {
    throw Error("method must be common, ceil or floor");
  }
  const int64_t precision = ToInt(b[0], "round");
  if (v.is_undefined()) ThrowUndefined(v);
  if (!v.is_number()) throw Error("type " + TypeName(v) + " doesn't define __round__ method");
  if (method == "common") {
    if (v.is_integral()) {
      if (precision >= 0) return Value::MakeInt(v.int_value());
      return Value::MakeInt(
          static_cast<int64_t>(RoundHalfEven(static_cast<double>(v.int_value()), precision)));
    }
    return Value::MakeFloat(RoundHalfEven(v.float_value(), precision));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double scaled = v.AsDouble() * scale;
  const double r = method == "ceil" ? std::ceil(scaled) : std::floor(scaled);
  return Value::MakeFloat(r / scale);
}

Value FSafe(Interp&, const Value& v, CallArgs& a) {
  BindArgs("safe", a, {});
  return Str(SoftStr(v));
}

Value FSlice(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("slice", a, {{"slices", std::nullopt}, {"fill_with", None()}});
  const ValueList seq = in.Iterate(v);
  const int64_t slices = ToInt(b[0], "slice");
  if (slices <= 0) throw Error("integer division or modulo by zero");
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices;
  const int64_t with_extra = length % slices;
  int64_t offset = 0;
  ValueList out;
  for (int64_t n = 0; n < slices; ++n) {
    const int64_t start = offset + n * per;
    if (n < with_extra) ++offset;
    const int64_t end = offset + (n + 1) * per;
    ValueList tmp(seq.begin() + start, seq.begin() + end);
    if (!b[1].is_none() && n >= with_extra) tmp.push_back(b[1]);
    out.push_back(Value::MakeList(std::move(tmp)));
  }
  return Value::MakeIterator(std::move(out));
}

Value FSort(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("sort", a,
                    {{"reverse", False()}, {"case_sensitive", False()}, {"attribute", None()}});
  ValueList items = in.Iterate(v);
  const auto getters = MultiGetter(b[2], !b[1].Truthy());
  std::vector<Value> keys;
  keys.reserve(items.size());
  for (const Value& item : items) keys.push_back(KeyOf(in, getters, item));
  return Value::MakeList(SortedBy(std::move(items), std::move(keys), b[0].Truthy()));
}

Value FString(Interp&, const Value& v, CallArgs& a) {
  BindArgs("string", a, {});
  return Str(SoftStr(v));
}

Value FSum(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("sum", a, {{"attribute", None()}, {"start", Value::MakeInt(0)}});
  if (b[1].is_string()) throw Error("sum() can't sum strings [use ''.join(seq) instead]");
  const AttrGetter getter(b[0], false, None());
  Value total = b[1];
  for (const Value& item : in.Iterate(v)) {
    total = in.BinaryOp(Op::kAdd, total, b[0].is_none() ? item : getter(in, item));
  }
  return total;
}

Value FTitle(Interp&, const Value& v, CallArgs& a) {
  BindArgs("title", a, {});
  // re.split(r"([-\s({\[<]+)", s): each piece becomes piece[0].upper() + piece[1:].lower().
  const std::u32string u = py::Decode(SoftStr(v));
  auto is_sep = [](char32_t c) {
    return py::IsSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < u.size()) {
    size_t j = i + 1;
    const bool sep = is_sep(u[i]);
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    out += py::Upper(py::Encode(u.substr(i, 1)));
    out += py::Lower(py::Encode(u.substr(i + 1, j - i - 1)));
    i = j;
  }
  return Str(std::move(out));
}

Value FToJson(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("tojson", a,
                    {{"ensure_ascii", False()},
                     {"indent", None()},
                     {"separators", None()},
                     {"sort_keys", False()}});
  JsonDumpOptions o;
  o.ensure_ascii = b[0].Truthy();
  if (b[1].is_string()) {
    o.indent = b[1].str();
  } else if (b[1].is_integral()) {
    o.indent =
        std::string(static_cast<size_t>(std::clamp<int64_t>(b[1].int_value(), 0, 1000)), ' ');
  } else if (!b[1].is_none()) {
    throw Error("indent must be an int or a string");
  }
  if (!b[2].is_none()) {
    if (!b[2].has_items() || b[2].items().size() != 2) {
      throw Error("separators must be a (item_separator, key_separator) pair");
    }
    o.item_separator = ToString(b[2].items()[0], "separators");
    o.key_separator = ToString(b[2].items()[1], "separators");
  }
  o.sort_keys = b[3].Truthy();
  return Str(DumpJson(v, o));
}

Value FTrim(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("trim", a, {{"chars", None()}});
  return Str(py::Strip(SoftStr(v), ToOptString(b[0], "trim"), true, true));
}

Value FTruncate(Interp&, const Value& v, CallArgs& a) {
  auto b = BindArgs("truncate", a,
                    {{"length", Value::MakeInt(255)},
                     {"killwords", False()},
                     {"end", Str("...")},
                     {"leeway", None()}});
  const std::u32string s = py::Decode(ToString(v, "truncate"));
  const int64_t length = ToInt(b[0], "truncate");
  const std::string& end = ToString(b[2], "truncate");
  const auto end_len = static_cast<int64_t>(py::Length(end));
  const int64_t leeway = b[3].is_none() ? 5 : ToInt(b[3], "truncate");
  if (length < end_len) throw Error("expected length >= " + std::to_string(end_len));
  if (leeway < 0) throw Error("expected leeway >= 0");
  if (static_cast<int64_t>(s.size()) <= length + leeway) return v;
  const std::u32string head = s.substr(0, static_cast<size_t>(length - end_len));
  if (b[1].Truthy()) return Str(py::Encode(head) + end);
  const size_t space = head.rfind(U' ');
  return Str(py::Encode(space == std::u32string::npos ? head : head.substr(0, space)) + end);
}

Value FUnique(Interp& in, const Value& v, CallArgs& a) {
  auto b = BindArgs("unique", a, {{"case_sensitive", False()}, {"attribute", None()}});
  const AttrGetter getter(b[1], !b[0].Truthy(), None());
  ValueList out;
  ValueList seen;
  for (const Value& item : in.Iterate(v)) {
    const Value key = getter(in, item);
    if (key.is_list() || key.is_dict()) throw Error("unhashable type: " + py::Repr(TypeName(key)));
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); })) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeIterator(std::move(out));
}

Value FWordcount(Interp&, const Value& v, CallArgs& a) {
  BindArgs("wordcount", a, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : py::Decode(SoftStr(v))) {
    const bool w = py::IsWordChar(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::MakeInt(n);
}

Value FUnsupported(Interp&, const Value&, CallArgs&) {
  throw Error("this jinja2 filter is not supported by Kestrel's chat template engine");
}

const std::unordered_map<std::string_view, FilterFn>& Table() {
  static const auto* table = new std::unordered_map<std::string_view, FilterFn>{
      {"abs", FAbs},
      {"attr", FAttr},
      {"batch", FBatch},
      {"capitalize", FCapitalize},
      {"center", FCenter},
      {"count", FLength},
      {"d", FDefault},
      {"default", FDefault},
      {"dictsort", FDictsort},
      {"e", FEscape},
      {"escape", FEscape},
      {"forceescape", FEscape},
      {"first", FFirst},
      {"float", FFloat},
      {"format", FFormat},
      {"indent", FIndent},
      {"int", FInt},
      {"items", FItems},
      {"join", FJoin},
      {"last", FLast},
      {"length", FLength},
      {"list", FList},
      {"lower", FLower},
      {"map", FMap},
      {"max", FMax},
      {"min", FMin},
      {"reject", FReject},
      {"rejectattr", FRejectAttr},
      {"replace", FReplace},
      {"reverse", FReverse},
      {"round", FRound},
      {"safe", FSafe},
      {"select", FSelect},
      {"selectattr", FSelectAttr},
      {"slice", FSlice},
      {"sort", FSort},
      {"string", FString},
      {"sum", FSum},
      {"title", FTitle},
      {"tojson", FToJson},
      {"trim", FTrim},
      {"truncate", FTruncate},
      {"unique", FUnique},
      {"upper", FUpper},
      {"wordcount", FWordcount},
      // Known to jinja2 but not implemented: templates using them fail when they reach them.
      {"filesizeformat", FUnsupported},
      {"groupby", FUnsupported},
      {"pprint", FUnsupported},
      {"random", FUnsupported},
      {"striptags", FUnsupported},
      {"urlencode", FUnsupported},
      {"urlize", FUnsupported},
      {"wordwrap", FUnsupported},
      {"xmlattr", FUnsupported},
  };
  return *table;
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  const auto& t = Table();
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

}  // namespace kestrel::jinja
