// JSON Schema → Grammar. One rule per object, array, constrained string or number (identical
// bodies share a rule), enums/consts/booleans/null inline. What each keyword enforces is listed in
// docs/structured-output.md; errors name the keyword and the JSON pointer of the schema holding it.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "grammar/front_ends.h"
#include "grammar/json_schema_numbers.h"
#include "grammar/json_string.h"

namespace kestrel::grammar {
namespace {

using json = nlohmann::ordered_json;
using json_numbers::Bound;

// Keywords that only annotate (or hold definitions): ignored where they stand.
const std::set<std::string, std::less<>> kIgnoredKeywords = {"title",
                                                             "description",
                                                             "default",
                                                             "examples",
                                                             "example",
                                                             "$schema",
                                                             "$id",
                                                             "$comment",
                                                             "$anchor",
                                                             "deprecated",
                                                             "readOnly",
                                                             "writeOnly",
                                                             "contentMediaType",
                                                             "contentEncoding",
                                                             "discriminator",
                                                             "$defs",
                                                             "definitions",
                                                             "externalDocs",
                                                             "xml",
                                                             "strict"};

// Validation keywords outside the supported subset: refused with their path.
const std::set<std::string, std::less<>> kRefusedKeywords = {"not",
                                                             "if",
                                                             "then",
                                                             "else",
                                                             "dependentRequired",
                                                             "dependentSchemas",
                                                             "dependencies",
                                                             "patternProperties",
                                                             "propertyNames",
                                                             "minProperties",
                                                             "maxProperties",
                                                             "contains",
                                                             "minContains",
                                                             "maxContains",
                                                             "unevaluatedItems",
                                                             "$dynamicRef",
                                                             "$recursiveRef",
                                                             "multipleOf",
                                                             "contentSchema"};

const std::set<std::string, std::less<>> kObjectKeywords = {
    "properties", "required", "additionalProperties", "unevaluatedProperties"};
const std::set<std::string, std::less<>> kArrayKeywords = {
    "items", "prefixItems", "minItems", "maxItems", "additionalItems", "uniqueItems"};
const std::set<std::string, std::less<>> kStringKeywords = {"minLength", "maxLength", "pattern",
                                                            "format"};
const std::set<std::string, std::less<>> kNumberKeywords = {"minimum", "maximum",
                                                            "exclusiveMinimum", "exclusiveMaximum"};

// JSON pointer escaping of one reference token.
std::string PointerToken(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

std::string Where(const std::string& path) {
  std::string out = "#";
  out += path;
  return out;
}

// path + "/" + token.
std::string Child(const std::string& path, std::string_view token) {
  std::string out = path;
  out += '/';
  out += token;
  return out;
}

// 'text'
std::string Quote(std::string_view text) {
  std::string out = "'";
  out += text;
  out += '\'';
  return out;
}

Status Invalid(const std::string& path, const std::string& message) {
  return InvalidArgument("json_schema: " + message + " at " + Where(path));
}
Status Refused(const std::string& path, const std::string& message) {
  return Unsupported("json_schema: " + message + " at " + Where(path));
}

class Converter {
 public:
  Converter(const json& root, const JsonSchemaOptions& options) : root_(root), options_(options) {}

  Result<Grammar> Run() {
    KASSIGN(Expr body, Schema(root_, ""));
    g_.set_root(g_.AddRule("root", std::move(body)));
    return std::move(g_);
  }

 private:
  // ---- shared pieces ----

  Expr Ws() const {
    if (options_.layout == JsonSchemaOptions::Layout::kPythonSeparators ||
        options_.max_whitespace_bytes == 0) {
      return Expr::Empty();
    }
    return Expr::Repeat(Expr::Class(CodepointSet::Of({{' ', ' '}, {'\t', '\n'}, {'\r', '\r'}})), 0,
                        options_.max_whitespace_bytes);
  }
  // ws <punctuation> ws (or ", " / ": ").
  Expr Separator(std::string_view punctuation) const {
    if (options_.layout == JsonSchemaOptions::Layout::kPythonSeparators) {
      return Expr::Literal(std::string(punctuation) + " ");
    }
    return Expr::Sequence({Ws(), Expr::Literal(punctuation), Ws()});
  }

  // A rule with this body: an existing rule with an identical body, or a new one.
  int32_t Intern(std::string_view name, Expr body) {
    std::string key = g_.ExprToGbnf(body);
    auto it = interned_.find(key);
    if (it != interned_.end()) return it->second;
    const int32_t id = g_.AddRule(name, std::move(body));
    interned_.emplace(std::move(key), id);
    return id;
  }

  Expr StringRule() {
    return Expr::Ref(Intern("string", json_string::Quoted(json_string::AnyChars())));
  }

  // Any JSON value (rules value, object, array).
  Expr ValueRule() {
    if (value_rule_ >= 0) return Expr::Ref(value_rule_);
    value_rule_ = g_.AddRule("value");
    const Expr value = Expr::Ref(value_rule_);
    const Expr member = Expr::Sequence({StringRule(), Separator(":"), value});
    const int32_t object = g_.AddRule(
        "object",
        Expr::Sequence({Expr::Literal("{"), Ws(),
                        Expr::Optional(Expr::Sequence(
                            {member, Expr::Star(Expr::Sequence({Separator(","), member}))})),
                        Ws(), Expr::Literal("}")}));
    const int32_t array = g_.AddRule(
        "array", Expr::Sequence({Expr::Literal("["), Ws(),
                                 Expr::Optional(Expr::Sequence(
                                     {value, Expr::Star(Expr::Sequence({Separator(","), value}))})),
                                 Ws(), Expr::Literal("]")}));
    const int32_t number = Intern("number", json_numbers::AnyNumber());
    g_.SetBody(value_rule_, Expr::Choice({Expr::Ref(object), Expr::Ref(array), StringRule(),
                                          Expr::Ref(number), Expr::Literal("true"),
                                          Expr::Literal("false"), Expr::Literal("null")}));
    object_rule_ = object;
    return value;
  }

  Expr AnyObjectRule() {
    ValueRule();
    return Expr::Ref(object_rule_);
  }

  // ---- keywords ----

  Status CheckKeywords(const json& s, const std::string& path) const {
    for (const auto& [key, value] : s.items()) {
      if (kRefusedKeywords.count(key)) {
        return Refused(path, "unsupported keyword '" + key + "'");
      }
      if (key == "uniqueItems" && value != json(false)) {
        return Refused(path, "unsupported keyword 'uniqueItems' (only false is supported)");
      }
      if (key == "unevaluatedProperties" && value != json(false)) {
        return Refused(path,
                       "unsupported keyword 'unevaluatedProperties' (only false is supported)");
      }
      if (key == "$ref" && !value.is_string()) return Invalid(path, "'$ref' must be a string");
    }
    return Status::Ok();
  }

  // Keys of s that constrain the instance (not annotations, not $defs).
  static std::vector<std::string> ValidationKeys(const json& s) {
    std::vector<std::string> keys;
    for (const auto& [key, value] : s.items()) {
      if (!kIgnoredKeywords.count(key)) keys.push_back(key);
    }
    return keys;
  }

  // Nesting deeper than this is refused (the conversion recurses per level).
  static constexpr int kMaxDepth = 128;

  Result<Expr> Schema(const json& s, const std::string& path) {
    if (depth_ >= kMaxDepth) {
      return Refused(path, "schema nesting deeper than " + std::to_string(kMaxDepth));
    }
    ++depth_;
    Result<Expr> e = SchemaAtDepth(s, path);
    --depth_;
    return e;
  }

  Result<Expr> SchemaAtDepth(const json& s, const std::string& path) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return ValueRule();
      return Refused(path, "schema 'false' (matches nothing)");
    }
    if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
    KTRY(CheckKeywords(s, path));

    bool nullable = false;
    if (auto it = s.find("nullable"); it != s.end()) {
      if (!it->is_boolean())
        return Invalid(Child(path, "nullable"), "'nullable' must be a boolean");
      nullable = it->get<bool>();
    }
    // Combinators stand alone: no other validation keyword beside them.
    for (const char* combinator : {"$ref", "anyOf", "oneOf", "allOf", "const", "enum"}) {
      if (!s.contains(combinator)) continue;
      for (const std::string& key : ValidationKeys(s)) {
        if (key == combinator || key == "nullable") continue;
        if ((std::string_view(combinator) == "const" || std::string_view(combinator) == "enum") &&
            key == "type") {
          continue;  // the values already have their type
        }
        return Refused(path, "'" + key + "' beside '" + combinator + "'");
      }
    }
    KASSIGN(Expr e, Combined(s, path));
    if (nullable) e = Expr::Choice({std::move(e), Expr::Literal("null")});
    return e;
  }

  Result<Expr> Combined(const json& s, const std::string& path) {
    if (auto it = s.find("$ref"); it != s.end())
      return Ref(it->get<std::string>(), Child(path, "$ref"));
    if (auto it = s.find("const"); it != s.end()) return Expr::Literal(it->dump());
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty())
        return Invalid(Child(path, "enum"), "'enum' must be a non-empty array");
      std::vector<Expr> values;
      for (const json& v : *it) values.push_back(Expr::Literal(v.dump()));
      return Expr::Choice(std::move(values));
    }
    for (const char* key : {"anyOf", "oneOf", "allOf"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      const std::string sub_path = Child(path, key);
      if (!it->is_array() || it->empty())
        return Invalid(sub_path, std::string("'") + key + "' must be a non-empty array");
      if (std::string_view(key) == "allOf" && it->size() != 1) {
        return Refused(sub_path, "'allOf' with more than one schema");
      }
      std::vector<Expr> alternatives;
      for (size_t i = 0; i < it->size(); ++i) {
        KASSIGN(Expr alt, Schema((*it)[i], sub_path + "/" + std::to_string(i)));
        alternatives.push_back(std::move(alt));
      }
      return Expr::Choice(std::move(alternatives));
    }
    return Typed(s, path);
  }

  Result<Expr> Typed(const json& s, const std::string& path) {
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      if (it->is_string()) {
        types.push_back(it->get<std::string>());
      } else if (it->is_array() && !it->empty()) {
        for (const json& t : *it) {
          if (!t.is_string()) return Invalid(Child(path, "type"), "'type' entries must be strings");
          types.push_back(t.get<std::string>());
        }
      } else {
        return Invalid(Child(path, "type"), "'type' must be a string or a non-empty array");
      }
    } else {
      // No type: inferred from the keywords present; none means any value.
      auto has_any = [&](const std::set<std::string, std::less<>>& keys) {
        for (const auto& [key, value] : s.items()) {
          if (keys.count(key)) return true;
        }
        return false;
      };
      if (has_any(kObjectKeywords)) types.push_back("object");
      if (has_any(kArrayKeywords)) types.push_back("array");
      if (has_any(kStringKeywords)) types.push_back("string");
      if (has_any(kNumberKeywords)) types.push_back("number");
      if (types.empty()) return ValueRule();
    }
    std::vector<Expr> alternatives;
    for (const std::string& type : types) {
      if (type == "null") {
        alternatives.push_back(Expr::Literal("null"));
      } else if (type == "boolean") {
        alternatives.push_back(Expr::Choice({Expr::Literal("true"), Expr::Literal("false")}));
      } else if (type == "integer" || type == "number") {
        KASSIGN(Expr e, Number(s, path, type == "integer"));
        alternatives.push_back(std::move(e));
      } else if (type == "string") {
        KASSIGN(Expr e, String(s, path));
        alternatives.push_back(std::move(e));
      } else if (type == "array") {
        KASSIGN(Expr e, Array(s, path));
        alternatives.push_back(std::move(e));
      } else if (type == "object") {
        KASSIGN(Expr e, Object(s, path));
        alternatives.push_back(std::move(e));
      } else {
        return Invalid(Child(path, "type"), "unknown type '" + type + "'");
      }
    }
    return Expr::Choice(std::move(alternatives));
  }

  // ---- $ref ----

  Result<Expr> Ref(const std::string& ref, const std::string& path) {
    if (auto it = ref_rules_.find(ref); it != ref_rules_.end()) return Expr::Ref(it->second);
    if (ref.empty() || ref[0] != '#') {
      return Refused(path, "'$ref' to '" + ref + "' (only local references '#...' are supported)");
    }
    const std::string pointer = ref.substr(1);
    const json* target = &root_;
    size_t pos = 0;
    std::string name = "root";
    while (pos < pointer.size()) {
      if (pointer[pos] != '/') return Invalid(path, "'$ref' '" + ref + "' is not a JSON pointer");
      const size_t next = pointer.find('/', pos + 1);
      const std::string_view escaped = std::string_view(pointer).substr(
          pos + 1, next == std::string::npos ? std::string::npos : next - pos - 1);
      std::string token;  // ~1 is '/', ~0 is '~'
      for (size_t i = 0; i < escaped.size(); ++i) {
        if (escaped[i] == '~' && i + 1 < escaped.size() &&
            (escaped[i + 1] == '0' || escaped[i + 1] == '1')) {
          token += escaped[++i] == '1' ? '/' : '~';
        } else {
          token += escaped[i];
        }
      }
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else if (target->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(token) < target->size()) {
        target = &(*target)[std::stoul(token)];
      } else {
        return Invalid(path, "'$ref' '" + ref + "' does not resolve");
      }
      name = token;
      pos = next == std::string::npos ? pointer.size() : next;
    }
    // The rule exists before its body is converted, so recursive references resolve to it.
    const int32_t rule = g_.AddRule(name);
    ref_rules_.emplace(ref, rule);
    KASSIGN(Expr body, Schema(*target, pointer));
    g_.SetBody(rule, std::move(body));
    return Expr::Ref(rule);
  }

  // ---- types ----

  Result<Expr> Number(const json& s, const std::string& path, bool integer) {
    std::optional<Bound> lo;
    std::optional<Bound> hi;
    auto read = [&](const char* key, bool exclusive, bool lower) -> Status {
      auto it = s.find(key);
      if (it == s.end() || it->is_boolean()) return Status::Ok();
      auto d = json_numbers::ParseDecimal(*it);
      if (!d.ok()) return Invalid(Child(path, key), Quote(key) + " must be a number");
      Bound b{*d, exclusive};
      std::optional<Bound>& slot = lower ? lo : hi;
      // Of two bounds on one side, keep the tighter.
      if (!slot || json_numbers::Tighter(b, *slot, lower)) slot = b;
      return Status::Ok();
    };
    // Draft 4 spells exclusive bounds as booleans beside minimum/maximum.
    const bool draft4_min =
        s.value("exclusiveMinimum", json()).is_boolean() && s["exclusiveMinimum"].get<bool>();
    const bool draft4_max =
        s.value("exclusiveMaximum", json()).is_boolean() && s["exclusiveMaximum"].get<bool>();
    KTRY(read("minimum", draft4_min, true));
    KTRY(read("exclusiveMinimum", true, true));
    KTRY(read("maximum", draft4_max, false));
    KTRY(read("exclusiveMaximum", true, false));
    auto e = integer ? json_numbers::IntegerInRange(lo, hi) : json_numbers::DecimalInRange(lo, hi);
    if (!e)
      return Invalid(
          path, std::string("no ") + (integer ? "integer" : "number") + " lies within the bounds");
    return Expr::Ref(Intern(integer ? "integer" : "number", std::move(*e)));
  }

  Result<Expr> String(const json& s, const std::string& path) {
    if (auto it = s.find("format"); it != s.end()) {
      if (!it->is_string()) return Invalid(Child(path, "format"), "'format' must be a string");
      if (auto content = json_string::Format(it->get<std::string>())) {
        return Expr::Ref(
            Intern("string-" + it->get<std::string>(), json_string::Quoted(std::move(*content))));
      }
      // Unknown formats are annotations (JSON Schema 2020-12): a plain string.
    }
    if (auto it = s.find("pattern"); it != s.end()) {
      if (!it->is_string()) return Invalid(Child(path, "pattern"), "'pattern' must be a string");
      auto regex = ParseRegex(it->get<std::string>(), RegexAnchoring::kSearch);
      if (!regex.ok()) {
        return Status(regex.status().code(), "json_schema: 'pattern' at " +
                                                 Where(Child(path, "pattern")) + ": " +
                                                 regex.status().message());
      }
      return Expr::Ref(Intern("string-pattern", json_string::Quoted(json_string::Escaped(*regex))));
    }
    uint32_t min_length = 0;
    uint32_t max_length = kUnbounded;
    KTRY(ReadCount(s, "minLength", path, &min_length));
    KTRY(ReadCount(s, "maxLength", path, &max_length));
    if (min_length > max_length) return Invalid(path, "'minLength' is above 'maxLength'");
    if (min_length == 0 && max_length == kUnbounded) return StringRule();
    return Expr::Ref(Intern("string", json_string::Quoted(Expr::Repeat(json_string::AnyChar(),
                                                                       min_length, max_length))));
  }

  // A non-negative integer keyword (absent: *out unchanged).
  static Status ReadCount(const json& s, const char* key, const std::string& path, uint32_t* out) {
    auto it = s.find(key);
    if (it == s.end()) return Status::Ok();
    if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0)) {
      return Invalid(Child(path, key), Quote(key) + " must be a non-negative integer");
    }
    const uint64_t v = it->get<uint64_t>();
    if (v > kMaxRepeatCount) {
      return Refused(Child(path, key), Quote(key) + " above " + std::to_string(kMaxRepeatCount));
    }
    *out = static_cast<uint32_t>(v);
    return Status::Ok();
  }

  Result<Expr> Array(const json& s, const std::string& path) {
    uint32_t min_items = 0;
    uint32_t max_items = kUnbounded;
    KTRY(ReadCount(s, "minItems", path, &min_items));
    KTRY(ReadCount(s, "maxItems", path, &max_items));
    // prefixItems (or draft-7 `items: [...]`), then `items` (or draft-7 `additionalItems`).
    std::vector<Expr> prefix;
    const json* rest = nullptr;
    std::string rest_path;
    const json* prefix_items = nullptr;
    std::string prefix_path;
    if (auto it = s.find("prefixItems"); it != s.end()) {
      prefix_items = &*it;
      prefix_path = Child(path, "prefixItems");
      if (auto items = s.find("items"); items != s.end())
        rest = &*items, rest_path = Child(path, "items");
    } else if (auto items = s.find("items"); items != s.end() && items->is_array()) {
      prefix_items = &*items;
      prefix_path = Child(path, "items");
      if (auto more = s.find("additionalItems"); more != s.end())
        rest = &*more, rest_path = Child(path, "additionalItems");
    } else if (items != s.end()) {
      rest = &*items, rest_path = Child(path, "items");
    }
    if (prefix_items != nullptr) {
      if (!prefix_items->is_array()) return Invalid(prefix_path, "must be an array of schemas");
      for (size_t i = 0; i < prefix_items->size(); ++i) {
        KASSIGN(Expr e, Schema((*prefix_items)[i], prefix_path + "/" + std::to_string(i)));
        prefix.push_back(std::move(e));
      }
    }
    // Items past the prefix: `items` when given; otherwise none in strict mode when there is a
    // prefix, any value else.
    std::optional<Expr> item;
    if (rest != nullptr) {
      if (*rest != json(false)) {
        KASSIGN(Expr e, Schema(*rest, rest_path));
        item = std::move(e);
      }
    } else if (prefix.empty() || !options_.strict) {
      item = ValueRule();
    }
    const uint32_t n_prefix = static_cast<uint32_t>(prefix.size());
    if (!item) max_items = std::min(max_items, n_prefix);
    if (min_items > max_items)
      return Invalid(path, "no array length satisfies 'minItems'/'maxItems' and the items allowed");

    // Element j (0-based) and everything after it, given elements 0..j-1 are present.
    auto element = [&](uint32_t j) -> Expr { return j < n_prefix ? prefix[j] : *item; };
    std::function<Expr(uint32_t)> tail = [&](uint32_t j) -> Expr {
      if (j >= max_items) return Expr::Empty();
      if (j >= n_prefix) {
        const uint32_t min_rest = min_items > j ? min_items - j : 0;
        const uint32_t max_rest = max_items == kUnbounded ? kUnbounded : max_items - j;
        return Expr::Repeat(Expr::Sequence({Separator(","), *item}), min_rest, max_rest);
      }
      Expr next = Expr::Sequence({Separator(","), element(j), tail(j + 1)});
      return j < min_items ? next : Expr::Optional(std::move(next));
    };
    Expr elements = Expr::Empty();
    if (max_items > 0) {
      elements = Expr::Sequence({element(0), tail(1)});
      if (min_items == 0) elements = Expr::Optional(std::move(elements));
    }
    return Expr::Ref(Intern("array", Expr::Sequence({Expr::Literal("["), Ws(), std::move(elements),
                                                     Ws(), Expr::Literal("]")})));
  }

  Result<Expr> Object(const json& s, const std::string& path) {
    struct Property {
      std::string key;
      Expr member;  // "key" ws : ws value
      bool required;
    };
    std::vector<std::string> required;
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array())
        return Invalid(Child(path, "required"), "'required' must be an array of strings");
      for (const json& r : *it) {
        if (!r.is_string())
          return Invalid(Child(path, "required"), "'required' must be an array of strings");
        required.push_back(r.get<std::string>());
      }
    }
    auto is_required = [&](const std::string& key) {
      return std::find(required.begin(), required.end(), key) != required.end();
    };
    std::vector<Property> properties;
    auto member = [&](const std::string& key, Expr value) {
      return Expr::Sequence({Expr::Literal(json(key).dump()), Separator(":"), std::move(value)});
    };
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object())
        return Invalid(Child(path, "properties"), "'properties' must be an object");
      for (const auto& [key, sub] : it->items()) {
        KASSIGN(Expr value, Schema(sub, path + "/properties/" + PointerToken(key)));
        properties.push_back({key, member(key, std::move(value)), is_required(key)});
      }
    }
    // Required keys without a schema: any value, after the declared ones.
    for (const std::string& key : required) {
      const bool declared = std::any_of(properties.begin(), properties.end(),
                                        [&](const Property& p) { return p.key == key; });
      if (!declared) properties.push_back({key, member(key, ValueRule()), true});
    }
    // Other keys: additionalProperties (absent: none in strict mode, any value otherwise).
    std::optional<Expr> extra;
    const json* additional = nullptr;
    std::string additional_path;
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      additional = &*it, additional_path = Child(path, "additionalProperties");
    } else if (auto un = s.find("unevaluatedProperties"); un != s.end()) {
      additional = &*un, additional_path = Child(path, "unevaluatedProperties");
    }
    std::optional<Expr> extra_value;
    if (additional != nullptr) {
      if (*additional != json(false)) {
        KASSIGN(extra_value, Schema(*additional, additional_path));
      }
    } else if (!options_.strict) {
      extra_value = ValueRule();
    }
    if (extra_value) {
      // An extra key is any key but the declared ones.
      std::vector<std::string> declared;
      for (const Property& p : properties) declared.push_back(p.key);
      const Expr key =
          declared.empty()
              ? StringRule()
              : Expr::Ref(
                    Intern("key", json_string::Quoted(json_string::AnyCharsExcept(declared))));
      extra = Expr::Sequence({key, Separator(":"), std::move(*extra_value)});
    }
    if (properties.empty() && extra && additional == nullptr && !options_.strict) {
      return AnyObjectRule();
    }

    // Members in declared order; an optional one may be skipped. Alternative k starts with the
    // k-th property (all before it optional and absent); extra keys follow the declared ones.
    const size_t n = properties.size();
    auto rest_after = [&](size_t k) {
      std::vector<Expr> parts;
      for (size_t i = k + 1; i < n; ++i) {
        Expr next = Expr::Sequence({Separator(","), properties[i].member});
        parts.push_back(properties[i].required ? std::move(next) : Expr::Optional(std::move(next)));
      }
      if (extra) parts.push_back(Expr::Star(Expr::Sequence({Separator(","), *extra})));
      return Expr::Sequence(std::move(parts));
    };
    std::vector<Expr> alternatives;
    bool all_optional = true;
    for (size_t k = 0; k < n && all_optional; ++k) {
      alternatives.push_back(Expr::Sequence({properties[k].member, rest_after(k)}));
      all_optional = !properties[k].required;
    }
    if (all_optional && extra) {
      alternatives.push_back(
          Expr::Sequence({*extra, Expr::Star(Expr::Sequence({Separator(","), *extra}))}));
    }
    Expr members = Expr::Empty();
    if (!alternatives.empty()) {
      members = Expr::Choice(std::move(alternatives));
      if (all_optional) members = Expr::Optional(std::move(members));
    }
    return Expr::Ref(Intern("object", Expr::Sequence({Expr::Literal("{"), Ws(), std::move(members),
                                                      Ws(), Expr::Literal("}")})));
  }

  const json& root_;
  JsonSchemaOptions options_;
  Grammar g_;
  std::unordered_map<std::string, int32_t> interned_;  // body GBNF → rule
  std::map<std::string, int32_t> ref_rules_;           // $ref string → rule
  int32_t value_rule_ = -1;
  int32_t object_rule_ = -1;
  int depth_ = 0;
};

}  // namespace

Result<Grammar> JsonSchemaValueToGrammar(const nlohmann::ordered_json& schema,
                                         const JsonSchemaOptions& options) {
  return Converter(schema, options).Run();
}

Result<Grammar> JsonSchemaToGrammar(std::string_view schema_json,
                                    const JsonSchemaOptions& options) {
  json schema = json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return InvalidArgument("json_schema: the schema is not valid JSON");
  return JsonSchemaValueToGrammar(schema, options);
}

Grammar JsonObjectGrammar(const JsonSchemaOptions& options) {
  JsonSchemaOptions open = options;
  open.strict = false;
  auto g = JsonSchemaValueToGrammar(json{{"type", "object"}}, open);
  return std::move(g).value();
}

}  // namespace kestrel::grammar
