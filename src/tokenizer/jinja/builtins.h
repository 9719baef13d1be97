// Builtin filters, tests, global functions and methods of str / dict / list, with the
// argument binding rules of Python calls.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/interp.h"
#include "tokenizer/jinja/value.h"

namespace kestrel::jinja {

// nullptr when jinja2 has no filter / test of that name.
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);

// The bound method `name` of a str, dict, list or tuple, or nullopt if it has none. Methods
// that would mutate (list.append, dict.update, ...) come back as Undefined, as the immutable
// sandbox makes them.
std::optional<Value> FindMethod(const Value& receiver, std::string_view name);

// range, dict, namespace, joiner, cycler, raise_exception, strftime_now.
void AddGlobals(Scope& scope);

// ---- Python call conventions ----
struct Param {
  std::string_view name;
  std::optional<Value> default_value;  // nullopt: required
};
// Binds positional and keyword arguments to `params` in order, like a Python def.
std::vector<Value> BindArgs(std::string_view fn, CallArgs& args,
                            std::initializer_list<Param> params);
// Argument conversions raising TypeError-style errors.
int64_t ToInt(const Value& v, std::string_view what);
const std::string& ToString(const Value& v, std::string_view what);
std::optional<std::string> ToOptString(const Value& v, std::string_view what);

// Python printf-style formatting: `format % args` (args: a tuple, a dict or one value).
std::string PercentFormat(const std::string& format, const Value& args);
// Python str.format.
std::string StrFormat(const std::string& format, const CallArgs& args);

}  // namespace kestrel::jinja
