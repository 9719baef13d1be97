// Values of the template language: the slice of Python's data model that chat templates
// touch (None, bool, int, float, str, list, tuple, dict, plus jinja2's Undefined and a few
// runtime objects), with Python's truthiness, equality, ordering, str() and repr().
//
// Lists and dicts are immutable once built (transformers renders in jinja2's
// ImmutableSandboxedEnvironment), so values share their payload and copy in O(1).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kestrel::jinja {

// Any error while parsing or rendering; becomes a Status at the public API boundary.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// raise_exception(message) called by a template: the message is reported verbatim.
class RaisedError : public Error {
 public:
  using Error::Error;
};

class Value;
class Interp;
using ValueList = std::vector<Value>;

struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Runtime objects with attributes and/or a call operator: namespace(), the loop variable,
// macros, builtin functions and bound methods.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string TypeName() const = 0;
  virtual std::string Repr() const = 0;
  virtual bool IsCallable() const { return false; }
  virtual Value Call(Interp& interp, CallArgs& args);
  // nullopt: no such attribute.
  virtual std::optional<Value> GetAttr(std::string_view name) const;
  // false: the object does not accept attribute assignment.
  virtual bool SetAttr(const std::string& name, const Value& value);
};

enum class Kind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kIterator,  // a generator (select, map, ...): iterable once, always truthy, no len()
  kDict,
  kObject,
};

class Dict;

class Value {
 public:
  Value() = default;  // Undefined

  static Value MakeUndefined(std::string hint = {});
  static Value MakeNone();
  static Value MakeBool(bool b);
  static Value MakeInt(int64_t i);
  static Value MakeFloat(double d);
  static Value MakeString(std::string s);
  static Value MakeList(ValueList items);
  static Value MakeTuple(ValueList items);
  static Value MakeIterator(ValueList items);
  static Value MakeDict(Dict d);
  static Value MakeObject(std::shared_ptr<Object> o);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // bool, int or float (Python's numbers.Number).
  bool is_number() const {
    return kind_ == Kind::kBool || kind_ == Kind::kInt || kind_ == Kind::kFloat;
  }
  // bool or int (Python's int, of which bool is a subclass).
  bool is_integral() const { return kind_ == Kind::kBool || kind_ == Kind::kInt; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kTuple; }
  bool is_iterator() const { return kind_ == Kind::kIterator; }
  // list, tuple or iterator: anything whose payload is a ValueList.
  bool has_items() const {
    return kind_ == Kind::kList || kind_ == Kind::kTuple || kind_ == Kind::kIterator;
  }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }

  bool bool_value() const { return scalar_.b; }
  int64_t int_value() const { return kind_ == Kind::kBool ? (scalar_.b ? 1 : 0) : scalar_.i; }
  double float_value() const { return scalar_.f; }
  // int, bool or float as a double.
  double AsDouble() const;
  const std::string& str() const { return *static_cast<const std::string*>(payload_.get()); }
  const ValueList& items() const { return *static_cast<const ValueList*>(payload_.get()); }
  const Dict& dict() const { return *static_cast<const Dict*>(payload_.get()); }
  Object* object() const { return static_cast<Object*>(payload_.get()); }
  // Why this value is undefined ("'x' is undefined"); used when it is misused.
  std::string undefined_hint() const;
  // The payload pointer, for Python's `is` (sameas).
  const void* identity() const { return payload_.get(); }

  // Python bool().
  bool Truthy() const;

 private:
  Kind kind_ = Kind::kUndefined;
  union Scalar {
    bool b;
    int64_t i;
    double f;
  } scalar_{};
  std::shared_ptr<void> payload_;
};

// Insertion-ordered mapping (Python dict). Keys are usually strings; other keys are found
// by Python equality (1 == 1.0 == True).
class Dict {
 public:
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
  const Value* Find(const Value& key) const;
  const Value* FindString(std::string_view key) const;
  // Replaces the value of an existing key (keeping its position) or appends.
  void Set(Value key, Value value);

 private:
  std::vector<std::pair<Value, Value>> entries_;
  std::unordered_map<std::string, size_t> string_index_;  // string key -> entry position
};

// ---- Python semantics shared by the interpreter and the builtins ----

// Python's type name: "str", "int", "list", "dict", "NoneType", ...
std::string TypeName(const Value& v);
// str(v) and repr(v).
std::string ToStr(const Value& v);
std::string ToRepr(const Value& v);
// Appends str(v) to out (avoids a copy for strings).
void AppendStr(std::string& out, const Value& v);
// ==, with Python's cross-type numeric equality.
bool Equals(const Value& a, const Value& b);
// <, raising TypeError (as Error) for unorderable operands.
bool Less(const Value& a, const Value& b);
// Throws the UndefinedError that using `v` (an Undefined) raises.
[[noreturn]] void ThrowUndefined(const Value& v);

}  // namespace kestrel::jinja
