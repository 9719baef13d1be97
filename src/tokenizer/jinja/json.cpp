#include "tokenizer/jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

namespace {

constexpr int kMaxDepth = 512;  // deeper input is refused rather than risking the stack

template <class Json>
Value Convert(const Json& j, int depth) {
  if (depth > kMaxDepth) throw Error("JSON input nested too deeply");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::MakeNone();
    case nlohmann::json::value_t::boolean:
      return Value::MakeBool(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::MakeInt(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u <= static_cast<uint64_t>(INT64_MAX)) return Value::MakeInt(static_cast<int64_t>(u));
      return Value::MakeFloat(static_cast<double>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::MakeFloat(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::MakeString(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(Convert(item, depth + 1));
      return Value::MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.Set(Value::MakeString(it.key()), Convert(it.value(), depth + 1));
      }
      return Value::MakeDict(std::move(d));
    }
    default:
      return Value::MakeNone();
  }
}

void AppendEscaped(std::string& out, const std::string& s, bool ensure_ascii) {
  char buf[16];
  out.push_back('"');
  size_t pos = 0;
  while (pos < s.size()) {
    size_t n = 0;
    const char32_t c = py::CharAt(s, pos, &n);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20 || (ensure_ascii && c >= 0x7F)) {
          if (c >= 0x10000) {
            const char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x",
                          static_cast<unsigned>(0xD800 | (v >> 10)),
                          static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          out.append(s, pos, n);
        }
    }
    pos += n;
  }
  out.push_back('"');
}

std::string FloatJson(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py::FloatRepr(d);
}

class Dumper {
 public:
  explicit Dumper(const JsonDumpOptions& o) : o_(o) {
    item_sep_ = o.item_separator ? *o.item_separator : (o.indent ? "," : ", ");
  }

  void Dump(const Value& v, int depth) {
    if (depth > kMaxDepth) throw Error("value nested too deeply for tojson");
    switch (v.kind()) {
      case Kind::kNone:
        out_ += "null";
        return;
      case Kind::kBool:
        out_ += v.bool_value() ? "true" : "false";
        return;
      case Kind::kInt:
        out_ += std::to_string(v.int_value());
        return;
      case Kind::kFloat:
        out_ += FloatJson(v.float_value());
        return;
      case Kind::kString:
        AppendEscaped(out_, v.str(), o_.ensure_ascii);
        return;
      case Kind::kList:
      case Kind::kTuple:
        DumpList(v.items(), depth);
        return;
      case Kind::kDict:
        DumpDict(v.dict(), depth);
        return;
      default:
        throw Error("Object of type " + TypeName(v) + " is not JSON serializable");
    }
  }

  std::string Take() { return std::move(out_); }

 private:
  void Newline(int depth) {
    if (!o_.indent) return;
    out_.push_back('\n');
    for (int i = 0; i < depth; ++i) out_ += *o_.indent;
  }

  void DumpList(const ValueList& items, int depth) {
    if (items.empty()) {
      out_ += "[]";
      return;
    }
    out_.push_back('[');
    Newline(depth + 1);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) {
        out_ += item_sep_;
        Newline(depth + 1);
      }
      Dump(items[i], depth + 1);
    }
    Newline(depth);
    out_.push_back(']');
  }

  static std::string KeyString(const Value& k) {
    switch (k.kind()) {
      case Kind::kString:
        return k.str();
      case Kind::kNone:
        return "null";
      case Kind::kBool:
        return k.bool_value() ? "true" : "false";
      case Kind::kInt:
        return std::to_string(k.int_value());
      case Kind::kFloat:
        return FloatJson(k.float_value());
      default:
        throw Error("keys must be str, int, float, bool or None, not " + TypeName(k));
    }
  }

  void DumpDict(const Dict& d, int depth) {
    if (d.empty()) {
      out_ += "{}";
      return;
    }
    std::vector<const std::pair<Value, Value>*> entries;
    entries.reserve(d.size());
    for (const auto& e : d.entries()) entries.push_back(&e);
    if (o_.sort_keys) {
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto* a, const auto* b) { return Less(a->first, b->first); });
    }
    out_.push_back('{');
    Newline(depth + 1);
    bool first = true;
    for (const auto* e : entries) {
      if (!first) {
        out_ += item_sep_;
        Newline(depth + 1);
      }
      first = false;
      AppendEscaped(out_, KeyString(e->first), o_.ensure_ascii);
      out_ += o_.key_separator;
      Dump(e->second, depth + 1);
    }
    Newline(depth);
    out_.push_back('}');
  }

  const JsonDumpOptions& o_;
  std::string item_sep_;
  std::string out_;
};

}  // namespace

Value FromJson(const nlohmann::ordered_json& j) {
  return Convert(j, 0);
}
Value FromJson(const nlohmann::json& j) {
  return Convert(j, 0);
}

nlohmann::ordered_json ToJsonValue(const Value& v) {
  switch (v.kind()) {
    case Kind::kBool:
      return v.bool_value();
    case Kind::kInt:
      return v.int_value();
    case Kind::kFloat:
      return v.float_value();
    case Kind::kString:
      return v.str();
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator: {
      auto arr = nlohmann::ordered_json::array();
      for (const Value& item : v.items()) arr.push_back(ToJsonValue(item));
      return arr;
    }
    case Kind::kDict: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [k, val] : v.dict().entries()) obj[ToStr(k)] = ToJsonValue(val);
      return obj;
    }
    default:
      return nullptr;
  }
}

std::string DumpJson(const Value& v, const JsonDumpOptions& options) {
  Dumper d(options);
  d.Dump(v, 0);
  return d.Take();
}

}  // namespace kestrel::jinja
