#include "tokenizer/jinja/value.h"

#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

// ---------------------------------------------------------------- Object defaults

Value Object::Call(Interp& /*interp*/, CallArgs& /*args*/) {
  throw Error("'" + TypeName() + "' object is not callable");
}

std::optional<Value> Object::GetAttr(std::string_view /*name*/) const {
  return std::nullopt;
}

bool Object::SetAttr(const std::string& /*name*/, const Value& /*value*/) {
  return false;
}

// ---------------------------------------------------------------- construction

Value Value::MakeUndefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.payload_ = std::make_shared<std::string>(std::move(hint));
  return v;
}

Value Value::MakeNone() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::MakeBool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.scalar_.b = b;
  return v;
}

Value Value::MakeInt(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.scalar_.i = i;
  return v;
}

Value Value::MakeFloat(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.scalar_.f = d;
  return v;
}

Value Value::MakeString(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.payload_ = std::make_shared<std::string>(std::move(s));
  return v;
}

Value Value::MakeList(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.payload_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::MakeTuple(ValueList items) {
  Value v = MakeList(std::move(items));
  v.kind_ = Kind::kTuple;
  return v;
}

Value Value::MakeIterator(ValueList items) {
  Value v = MakeList(std::move(items));
  v.kind_ = Kind::kIterator;
  return v;
}

Value Value::MakeDict(Dict d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.payload_ = std::make_shared<Dict>(std::move(d));
  return v;
}

Value Value::MakeObject(std::shared_ptr<Object> o) {
  Value v;
  v.kind_ = Kind::kObject;
  v.payload_ = std::move(o);
  return v;
}

double Value::AsDouble() const {
  switch (kind_) {
    case Kind::kBool:
      return scalar_.b ? 1.0 : 0.0;
    case Kind::kInt:
      return static_cast<double>(scalar_.i);
    case Kind::kFloat:
      return scalar_.f;
    default:
      throw Error("must be real number, not " + TypeName(*this));
  }
}

std::string Value::undefined_hint() const {
  if (kind_ != Kind::kUndefined || !payload_) return "value is undefined";
  return *static_cast<const std::string*>(payload_.get());
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return scalar_.b;
    case Kind::kInt:
      return scalar_.i != 0;
    case Kind::kFloat:
      return scalar_.f != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
    case Kind::kTuple:
      return !items().empty();
    case Kind::kIterator:
    case Kind::kObject:
      return true;
    case Kind::kDict:
      return !dict().empty();
  }
  return false;
}

// ---------------------------------------------------------------- Dict

namespace {
constexpr size_t kIndexThreshold = 8;  // below this, a linear scan beats hashing
}

const Value* Dict::FindString(std::string_view key) const {
  if (!string_index_.empty()) {
    auto it = string_index_.find(std::string(key));
    return it == string_index_.end() ? nullptr : &entries_[it->second].second;
  }
  for (const auto& [k, v] : entries_) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(const Value& key) const {
  if (key.is_string()) return FindString(key.str());
  for (const auto& [k, v] : entries_) {
    if (!k.is_string() && Equals(k, key)) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  if (key.is_string()) {
    if (!string_index_.empty()) {
      auto it = string_index_.find(key.str());
      if (it != string_index_.end()) {
        entries_[it->second].second = std::move(value);
        return;
      }
    } else {
      for (auto& [k, v] : entries_) {
        if (k.is_string() && k.str() == key.str()) {
          v = std::move(value);
          return;
        }
      }
    }
  } else {
    for (auto& [k, v] : entries_) {
      if (!k.is_string() && Equals(k, key)) {
        v = std::move(value);
        return;
      }
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (entries_.size() == kIndexThreshold) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first.is_string()) string_index_.emplace(entries_[i].first.str(), i);
    }
  } else if (entries_.size() > kIndexThreshold && entries_.back().first.is_string()) {
    string_index_.emplace(entries_.back().first.str(), entries_.size() - 1);
  }
}

// ---------------------------------------------------------------- str / repr

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kIterator:
      return "generator";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return v.object()->TypeName();
  }
  return "object";
}

namespace {

void AppendRepr(std::string& out, const Value& v);

void AppendItems(std::string& out, const ValueList& items) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ", ";
    AppendRepr(out, items[i]);
  }
}

void AppendRepr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      out += "Undefined";
      return;
    case Kind::kString:
      out += py::Repr(v.str());
      return;
    case Kind::kList:
      out += '[';
      AppendItems(out, v.items());
      out += ']';
      return;
    case Kind::kTuple:
      out += '(';
      AppendItems(out, v.items());
      if (v.items().size() == 1) out += ',';
      out += ')';
      return;
    case Kind::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, val] : v.dict().entries()) {
        if (!first) out += ", ";
        first = false;
        AppendRepr(out, k);
        out += ": ";
        AppendRepr(out, val);
      }
      out += '}';
      return;
    }
    default:
      AppendStr(out, v);
  }
}

}  // namespace

void AppendStr(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::kUndefined:
      return;
    case Kind::kNone:
      out += "None";
      return;
    case Kind::kBool:
      out += v.bool_value() ? "True" : "False";
      return;
    case Kind::kInt:
      out += std::to_string(v.int_value());
      return;
    case Kind::kFloat:
      out += py::FloatRepr(v.float_value());
      return;
    case Kind::kString:
      out += v.str();
      return;
    case Kind::kIterator:
      out += "<generator object>";
      return;
    case Kind::kObject:
      out += v.object()->Repr();
      return;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kDict:
      AppendRepr(out, v);
      return;
  }
}

std::string ToStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string out;
  AppendStr(out, v);
  return out;
}

std::string ToRepr(const Value& v) {
  std::string out;
  AppendRepr(out, v);
  return out;
}

// ---------------------------------------------------------------- comparison

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.int_value() == b.int_value();
    return a.AsDouble() == b.AsDouble();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return a.identity() == b.identity() || a.str() == b.str();
    case Kind::kList:
    case Kind::kTuple: {
      const ValueList& x = a.items();
      const ValueList& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!Equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& x = a.dict();
      const Dict& y = b.dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.Find(k);
        if (other == nullptr || !Equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

bool Less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) return a.int_value() < b.int_value();
    return a.AsDouble() < b.AsDouble();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) ThrowUndefined(a);
  if (b.is_undefined()) ThrowUndefined(b);
  throw Error("'<' not supported between instances of '" + TypeName(a) + "' and '" + TypeName(b) +
              "'");
}

void ThrowUndefined(const Value& v) {
  throw Error(v.undefined_hint());
}

}  // namespace kestrel::jinja
