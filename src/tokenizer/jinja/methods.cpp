// Methods of builtin values reachable from templates (str.split, dict.get, list.index, ...)
// and str.format.
#include <algorithm>
#include <cstdio>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

namespace {

using Method = Value (*)(Interp&, const Value& self, CallArgs& args);

Value Bound(const Value& self, std::string_view name, Method m) {
  return Value::MakeObject(std::make_shared<Function>(
      std::string(name), [self, m](Interp& in, CallArgs& args) { return m(in, self, args); }));
}

Value Str(std::string s) {
  return Value::MakeString(std::move(s));
}

Value StrList(const std::vector<std::string>& parts) {
  ValueList out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Str(p));
  return Value::MakeList(std::move(out));
}

// Optional start/end arguments of find/count/startswith (None means unbounded).
void Bounds(const Value& start, const Value& end, int64_t* s, int64_t* e) {
  *s = start.is_none() ? 0 : ToInt(start, "slice indices");
  *e = end.is_none() ? INT64_MAX : ToInt(end, "slice indices");
}

Value AffixTest(const Value& self, CallArgs& args, bool suffix) {
  const char* fn = suffix ? "endswith" : "startswith";
  auto a = BindArgs(
      fn, args,
      {{"prefix", std::nullopt}, {"start", Value::MakeNone()}, {"end", Value::MakeNone()}});
  int64_t s = 0;
  int64_t e = 0;
  Bounds(a[1], a[2], &s, &e);
  const std::string& str = self.str();
  ValueList candidates;
  if (a[0].is_tuple()) {
    candidates = a[0].items();
  } else if (a[0].is_string()) {
    candidates.push_back(a[0]);
  } else {
    throw Error(std::string(fn) + " first arg must be str or a tuple of str, not " +
                TypeName(a[0]));
  }
  if (a[1].is_none() && a[2].is_none()) {  // whole string: compare bytes
    for (const Value& c : candidates) {
      const std::string& p = ToString(c, fn);
      if (p.size() > str.size()) continue;
      const bool hit = suffix ? str.compare(str.size() - p.size(), p.size(), p) == 0
                              : str.compare(0, p.size(), p) == 0;
      if (hit) return Value::MakeBool(true);
    }
    return Value::MakeBool(false);
  }
  const auto n = static_cast<int64_t>(py::Length(str));
  py::AdjustIndices(n, &s, &e);
  if (s > n) return Value::MakeBool(false);
  const std::u32string u = py::Decode(str);
  const std::u32string window =
      u.substr(static_cast<size_t>(s), static_cast<size_t>(std::max<int64_t>(0, e - s)));
  for (const Value& c : candidates) {
    const std::u32string p = py::Decode(ToString(c, fn));
    if (p.size() > window.size()) continue;
    const bool hit = suffix ? window.compare(window.size() - p.size(), p.size(), p) == 0
                            : window.compare(0, p.size(), p) == 0;
    if (hit) return Value::MakeBool(true);
  }
  return Value::MakeBool(false);
}

Value FindLike(const Value& self, CallArgs& args, const char* fn, bool reverse, bool raise) {
  auto a = BindArgs(
      fn, args, {{"sub", std::nullopt}, {"start", Value::MakeNone()}, {"end", Value::MakeNone()}});
  int64_t s = 0;
  int64_t e = 0;
  Bounds(a[1], a[2], &s, &e);
  const int64_t r = py::Find(self.str(), ToString(a[0], fn), s, e, reverse);
  if (r < 0 && raise) throw Error("substring not found");
  return Value::MakeInt(r);
}

Value Partition(const Value& self, CallArgs& args, bool reverse) {
  auto a = BindArgs(reverse ? "rpartition" : "partition", args, {{"sep", std::nullopt}});
  const std::string& sep = ToString(a[0], "partition");
  if (sep.empty()) throw Error("empty separator");
  const std::string& s = self.str();
  const size_t hit = reverse ? s.rfind(sep) : s.find(sep);
  if (hit == std::string::npos) {
    return reverse ? Value::MakeTuple({Str(""), Str(""), Str(s)})
                   : Value::MakeTuple({Str(s), Str(""), Str("")});
  }
  return Value::MakeTuple({Str(s.substr(0, hit)), Str(sep), Str(s.substr(hit + sep.size()))});
}

Value Pad(const Value& self, CallArgs& args, const char* fn, int mode) {
  auto a = BindArgs(fn, args, {{"width", std::nullopt}, {"fillchar", Str(" ")}});
  const std::string& fill = ToString(a[1], fn);
  if (py::Length(fill) != 1) throw Error("The fill character must be exactly one character long");
  size_t n = 0;
  const char32_t c = py::CharAt(fill, 0, &n);
  const int64_t width = ToInt(a[0], fn);
  if (mode == 0) return Str(py::Center(self.str(), width, c));
  return Str(py::Ljust(self.str(), width, c, mode == 2));
}

template <bool (*Pred)(char32_t)>
Value AllChars(Interp&, const Value& self, CallArgs& args) {
  BindArgs("is", args, {});
  const std::u32string u = py::Decode(self.str());
  if (u.empty()) return Value::MakeBool(false);
  return Value::MakeBool(std::all_of(u.begin(), u.end(), Pred));
}

std::optional<Value> StrMethod(const Value& self, std::string_view name) {
  static const std::pair<std::string_view, Method> kMethods[] = {
      {"startswith", [](Interp&, const Value& s, CallArgs& a) { return AffixTest(s, a, false); }},
      {"endswith", [](Interp&, const Value& s, CallArgs& a) { return AffixTest(s, a, true); }},
      {"split", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("split", a, {{"sep", Value::MakeNone()}, {"maxsplit", Value::MakeInt(-1)}});
         return StrList(py::Split(s.str(), ToOptString(b[0], "split"), ToInt(b[1], "split")));
       }},
      {"rsplit", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("rsplit", a, {{"sep", Value::MakeNone()}, {"maxsplit", Value::MakeInt(-1)}});
         return StrList(py::RSplit(s.str(), ToOptString(b[0], "rsplit"), ToInt(b[1], "rsplit")));
       }},
      {"splitlines", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("splitlines", a, {{"keepends", Value::MakeBool(false)}});
         return StrList(py::SplitLines(s.str(), b[0].Truthy()));
       }},
      {"strip", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("strip", a, {{"chars", Value::MakeNone()}});
         return Str(py::Strip(s.str(), ToOptString(b[0], "strip"), true, true));
       }},
      {"lstrip", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("lstrip", a, {{"chars", Value::MakeNone()}});
         return Str(py::Strip(s.str(), ToOptString(b[0], "lstrip"), true, false));
       }},
      {"rstrip", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("rstrip", a, {{"chars", Value::MakeNone()}});
         return Str(py::Strip(s.str(), ToOptString(b[0], "rstrip"), false, true));
       }},
      {"replace", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("replace", a, {{"old", std::nullopt}, {"new", std::nullopt},
                                          {"count", Value::MakeInt(-1)}});
         return Str(py::Replace(s.str(), ToString(b[0], "replace"), ToString(b[1], "replace"),
                                ToInt(b[2], "replace")));
       }},
      {"upper", [](Interp&, const Value& s, CallArgs& a) { BindArgs("upper", a, {}); return Str(py::Upper(s.str())); }},
      {"lower", [](Interp&, const Value& s, CallArgs& a) { BindArgs("lower", a, {}); return Str(py::Lower(s.str())); }},
      {"casefold", [](Interp&, const Value& s, CallArgs& a) { BindArgs("casefold", a, {}); return Str(py::Lower(s.str())); }},
      {"title", [](Interp&, const Value& s, CallArgs& a) { BindArgs("title", a, {}); return Str(py::Title(s.str())); }},
      {"capitalize", [](Interp&, const Value& s, CallArgs& a) { BindArgs("capitalize", a, {}); return Str(py::Capitalize(s.str())); }},
      {"swapcase", [](Interp&, const Value& s, CallArgs& a) { BindArgs("swapcase", a, {}); return Str(py::SwapCase(s.str())); }},
      {"find", [](Interp&, const Value& s, CallArgs& a) { return FindLike(s, a, "find", false, false); }},
      {"rfind", [](Interp&, const Value& s, CallArgs& a) { return FindLike(s, a, "rfind", true, false); }},
      {"index", [](Interp&, const Value& s, CallArgs& a) { return FindLike(s, a, "index", false, true); }},
      {"rindex", [](Interp&, const Value& s, CallArgs& a) { return FindLike(s, a, "rindex", true, true); }},
      {"count", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("count", a, {{"sub", std::nullopt}, {"start", Value::MakeNone()},
                                        {"end", Value::MakeNone()}});
         int64_t st = 0;
         int64_t en = 0;
         Bounds(b[1], b[2], &st, &en);
         return Value::MakeInt(py::Count(s.str(), ToString(b[0], "count"), st, en));
       }},
      {"join", [](Interp& in, const Value& s, CallArgs& a) {
         auto b = BindArgs("join", a, {{"iterable", std::nullopt}});
         std::string out;
         size_t i = 0;
         for (const Value& item : in.Iterate(b[0])) {
           if (!item.is_string()) {
             throw Error("sequence item " + std::to_string(i) + ": expected str instance, " +
                         TypeName(item) + " found");
           }
           if (i++) out += s.str();
           out += item.str();
         }
         return Str(std::move(out));
       }},
      {"format", [](Interp&, const Value& s, CallArgs& a) { return Str(StrFormat(s.str(), a)); }},
      {"center", [](Interp&, const Value& s, CallArgs& a) { return Pad(s, a, "center", 0); }},
      {"ljust", [](Interp&, const Value& s, CallArgs& a) { return Pad(s, a, "ljust", 1); }},
      {"rjust", [](Interp&, const Value& s, CallArgs& a) { return Pad(s, a, "rjust", 2); }},
      {"zfill", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("zfill", a, {{"width", std::nullopt}});
         return Str(py::Zfill(s.str(), ToInt(b[0], "zfill")));
       }},
      {"partition", [](Interp&, const Value& s, CallArgs& a) { return Partition(s, a, false); }},
      {"rpartition", [](Interp&, const Value& s, CallArgs& a) { return Partition(s, a, true); }},
      {"removeprefix", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("removeprefix", a, {{"prefix", std::nullopt}});
         const std::string& p = ToString(b[0], "removeprefix");
         return Str(s.str().compare(0, p.size(), p) == 0 ? s.str().substr(p.size()) : s.str());
       }},
      {"removesuffix", [](Interp&, const Value& s, CallArgs& a) {
         auto b = BindArgs("removesuffix", a, {{"suffix", std::nullopt}});
         const std::string& p = ToString(b[0], "removesuffix");
         const std::string& str = s.str();
         const bool hit = !p.empty() && str.size() >= p.size() &&
                          str.compare(str.size() - p.size(), p.size(), p) == 0;
         return Str(hit ? str.substr(0, str.size() - p.size()) : str);
       }},
      {"isdigit", AllChars<py::IsDigit>},
      {"isdecimal", AllChars<py::IsDecimal>},
      {"isnumeric", AllChars<py::IsNumeric>},
      {"isalpha", AllChars<py::IsAlpha>},
      {"isalnum", AllChars<py::IsAlnum>},
      {"isspace", AllChars<py::IsSpace>},
      {"isupper", [](Interp&, const Value& s, CallArgs& a) { BindArgs("isupper", a, {}); return Value::MakeBool(py::StrIsUpper(s.str())); }},
      {"islower", [](Interp&, const Value& s, CallArgs& a) { BindArgs("islower", a, {}); return Value::MakeBool(py::StrIsLower(s.str())); }},
  };
  for (const auto& [n, m] : kMethods) {
    if (n == name) return Bound(self, name, m);
  }
  return std::nullopt;
}

Value SeqIndex(Interp&, const Value& self, CallArgs& args) {
  auto a = BindArgs("index", args, {{"value", std::nullopt}});
  const ValueList& items = self.items();
  for (size_t i = 0; i < items.size(); ++i) {
    if (Equals(items[i], a[0])) return Value::MakeInt(static_cast<int64_t>(i));
  }
  throw Error(ToRepr(a[0]) + " is not in " + TypeName(self));
}

Value SeqCount(Interp&, const Value& self, CallArgs& args) {
  auto a = BindArgs("count", args, {{"value", std::nullopt}});
  int64_t n = 0;
  for (const Value& v : self.items()) n += Equals(v, a[0]) ? 1 : 0;
  return Value::MakeInt(n);
}

Value DictItems(Interp&, const Value& self, CallArgs& args) {
  BindArgs("items", args, {});
  ValueList out;
  for (const auto& [k, v] : self.dict().entries()) out.push_back(Value::MakeTuple({k, v}));
  return Value::MakeList(std::move(out));
}

Value DictKeys(Interp&, const Value& self, CallArgs& args) {
  BindArgs("keys", args, {});
  ValueList out;
  for (const auto& [k, v] : self.dict().entries()) out.push_back(k);
  return Value::MakeList(std::move(out));
}

Value DictValues(Interp&, const Value& self, CallArgs& args) {
  BindArgs("values", args, {});
  ValueList out;
  for (const auto& [k, v] : self.dict().entries()) out.push_back(v);
  return Value::MakeList(std::move(out));
}

Value DictGet(Interp&, const Value& self, CallArgs& args) {
  auto a = BindArgs("get", args, {{"key", std::nullopt}, {"default", Value::MakeNone()}});
  if (a[0].is_list() || a[0].is_dict()) throw Error("unhashable type: " + py::Repr(TypeName(a[0])));
  const Value* v = self.dict().Find(a[0]);
  return v ? *v : a[1];
}

Value Copy(Interp&, const Value& self, CallArgs& args) {
  BindArgs("copy", args, {});
  return self;
}

bool IsMutator(std::string_view name, bool is_dict) {
  static constexpr std::string_view kList[] = {"append", "extend",  "insert", "pop",
                                               "remove", "reverse", "sort",   "clear"};
  static constexpr std::string_view kDict[] = {"pop", "popitem", "setdefault", "update", "clear"};
  if (is_dict) return std::find(std::begin(kDict), std::end(kDict), name) != std::end(kDict);
  return std::find(std::begin(kList), std::end(kList), name) != std::end(kList);
}

}  // namespace

std::optional<Value> FindMethod(const Value& receiver, std::string_view name) {
  switch (receiver.kind()) {
    case Kind::kString:
      return StrMethod(receiver, name);
    case Kind::kDict:
      if (name == "items") return Bound(receiver, name, DictItems);
      if (name == "keys") return Bound(receiver, name, DictKeys);
      if (name == "values") return Bound(receiver, name, DictValues);
      if (name == "get") return Bound(receiver, name, DictGet);
      if (name == "copy") return Bound(receiver, name, Copy);
      if (IsMutator(name, true)) {
        return Value::MakeUndefined("access to attribute " + py::Repr(std::string(name)) +
                                    " of 'dict' object is unsafe.");
      }
      return std::nullopt;
    case Kind::kList:
    case Kind::kTuple:
      if (name == "index") return Bound(receiver, name, SeqIndex);
      if (name == "count") return Bound(receiver, name, SeqCount);
      if (receiver.is_list() && name == "copy") return Bound(receiver, name, Copy);
      if (receiver.is_list() && IsMutator(name, false)) {
        return Value::MakeUndefined("access to attribute " + py::Repr(std::string(name)) +
                                    " of 'list' object is unsafe.");
      }
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// ---------------------------------------------------------------- str.format

namespace {

std::string FormatValue(const Value& v, const std::string& spec) {
  if (spec.empty()) return ToStr(v);
  // [[fill]align][sign][#][0][width][,|_][.precision][type]
  size_t i = 0;
  char32_t fill = ' ';
  char align = 0;
  const std::u32string u = py::Decode(spec);
  if (u.size() >= 2 && (u[1] == '<' || u[1] == '>' || u[1] == '^' || u[1] == '=')) {
    fill = u[0];
    align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && (u[0] == '<' || u[0] == '>' || u[0] == '^' || u[0] == '=')) {
    align = static_cast<char>(u[0]);
    i = 1;
  }
  std::string rest = py::Encode(u.substr(i));
  size_t p = 0;
  std::string sign;
  if (p < rest.size() && (rest[p] == '+' || rest[p] == '-' || rest[p] == ' ')) sign = rest[p++];
  bool alt = false;
  if (p < rest.size() && rest[p] == '#') {
    alt = true;
    ++p;
  }
  if (p < rest.size() && rest[p] == '0') {
    if (align == 0) {
      fill = '0';
      align = '=';
    }
    ++p;
  }
  int64_t width = 0;
  while (p < rest.size() && rest[p] >= '0' && rest[p] <= '9')
    width = width * 10 + (rest[p++] - '0');
  if (p < rest.size() && (rest[p] == ',' || rest[p] == '_')) {
    throw Error("thousands separators in format specs are not supported");
  }
  int64_t precision = -1;
  if (p < rest.size() && rest[p] == '.') {
    ++p;
    precision = 0;
    while (p < rest.size() && rest[p] >= '0' && rest[p] <= '9') {
      precision = precision * 10 + (rest[p++] - '0');
    }
  }
  const char type = p < rest.size() ? rest[p++] : 0;
  if (p != rest.size() || width > 100000 || precision > 1000) {
    throw Error("Invalid format specifier");
  }
  std::string body;
  bool numeric = false;
  if (v.is_string() || v.is_undefined() || v.is_none() || !v.is_number()) {
    if (type != 0 && type != 's') throw Error("Unknown format code '" + std::string(1, type) + "'");
    body = ToStr(v);
    if (precision >= 0)
      body = py::Encode(py::Decode(body).substr(0, static_cast<size_t>(precision)));
  } else {
    numeric = true;
    std::string cspec = "%" + sign + (alt ? "#" : "");
    char buf[512];
    if ((type == 0 || type == 'd' || type == 'x' || type == 'X' || type == 'o' || type == 'b') &&
        v.is_integral() && !(type == 0 && precision >= 0)) {
      if (type == 'b') {
        int64_t n = v.int_value();
        std::string bits;
        uint64_t m = n < 0 ? static_cast<uint64_t>(-(n + 1)) + 1 : static_cast<uint64_t>(n);
        do {
          bits.insert(bits.begin(), static_cast<char>('0' + (m & 1)));
          m >>= 1;
        } while (m);
        body = (n < 0 ? "-" : sign == "-" ? "" : sign) + std::string(alt ? "0b" : "") + bits;
      } else {
        cspec += "ll";
        cspec.push_back(type == 0 ? 'd' : type);
        std::snprintf(buf, sizeof(buf), cspec.c_str(), static_cast<long long>(v.int_value()));
        body = buf;
      }
    } else if (type == 0 && precision < 0) {
      body = ToStr(v.is_bool() ? Value::MakeInt(v.int_value()) : v);
      if (!sign.empty() && sign != "-" && v.AsDouble() >= 0) body = sign + body;
    } else {
      char t = type == 0 ? 'g' : type;
      double d = v.AsDouble();
      std::string suffix;
      if (t == '%') {
        d *= 100;
        t = 'f';
        suffix = "%";
      }
      if (std::string_view("eEfFgG").find(t) == std::string_view::npos) {
        throw Error("Unknown format code '" + std::string(1, t) + "' for float");
      }
      cspec += "." + std::to_string(precision >= 0 ? precision : 6);
      cspec.push_back(t);
      std::snprintf(buf, sizeof(buf), cspec.c_str(), d);
      body = std::string(buf) + suffix;
    }
  }
  const auto len = static_cast<int64_t>(py::Length(body));
  if (width <= len) return body;
  if (align == 0) align = numeric ? '>' : '<';
  std::string pad;
  const int64_t total = width - len;
  auto pad_of = [&](int64_t k) {
    std::string s;
    for (int64_t j = 0; j < k; ++j) py::AppendUtf8(s, fill);
    return s;
  };
  switch (align) {
    case '<':
      return body + pad_of(total);
    case '>':
      return pad_of(total) + body;
    case '^':
      return pad_of(total / 2) + body + pad_of(total - total / 2);
    default: {  // '=': padding after the sign
      const size_t sign_len =
          (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) ? 1 : 0;
      return body.substr(0, sign_len) + pad_of(total) + body.substr(sign_len);
    }
  }
}

}  // namespace

std::string StrFormat(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  size_t i = 0;
  while (i < fmt.size()) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      throw Error("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    const size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close + 1;
    std::string spec;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conversion = 0;
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) throw Error("expected ':' after conversion specifier");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    const size_t sep = field.find_first_of(".[");
    const std::string head = field.substr(0, sep);
    Value v;
    if (head.empty()) {
      if (auto_index >= args.positional.size()) {
        throw Error("Replacement index " + std::to_string(auto_index) +
                    " out of range for positional args tuple");
      }
      v = args.positional[auto_index++];
    } else if (std::all_of(head.begin(), head.end(),
                           [](char ch) { return ch >= '0' && ch <= '9'; })) {
      const size_t k = std::stoul(head);
      if (k >= args.positional.size()) {
        throw Error("Replacement index " + head + " out of range for positional args tuple");
      }
      v = args.positional[k];
    } else {
      auto it = std::find_if(args.keywords.begin(), args.keywords.end(),
                             [&](const auto& kv) { return kv.first == head; });
      if (it == args.keywords.end()) throw Error("KeyError: " + py::Repr(head));
      v = it->second;
    }
    if (sep != std::string::npos) {
      throw Error("attribute and index lookups in format fields are not supported");
    }
    if (conversion == 'r' || conversion == 'a') {
      v = Value::MakeString(ToRepr(v));
    } else if (conversion == 's') {
      v = Value::MakeString(ToStr(v));
    } else if (conversion != 0) {
      throw Error("Unknown conversion specifier " + std::string(1, conversion));
    }
    out += FormatValue(v, spec);
  }
  return out;
}

}  // namespace kestrel::jinja
