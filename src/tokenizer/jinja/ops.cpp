// Python's arithmetic, comparison and membership operators, and printf-style `%` formatting.
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/interp.h"
#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja {

namespace {

constexpr size_t kMaxRepeatBytes = size_t{64} << 20;  // 'x' * n beyond this is refused

const char* OpSymbol(Op op) {
  switch (op) {
    case Op::kAdd:
      return "+";
    case Op::kSub:
      return "-";
    case Op::kMul:
      return "*";
    case Op::kDiv:
      return "/";
    case Op::kFloorDiv:
      return "//";
    case Op::kMod:
      return "%";
    case Op::kPow:
      return "** or pow()";
    case Op::kLt:
      return "<";
    case Op::kLe:
      return "<=";
    case Op::kGt:
      return ">";
    case Op::kGe:
      return ">=";
    default:
      return "?";
  }
}

[[noreturn]] void Unsupported(Op op, const Value& a, const Value& b) {
  throw Error(std::string("unsupported operand type(s) for ") + OpSymbol(op) + ": " +
              py::Repr(TypeName(a)) + " and " + py::Repr(TypeName(b)));
}

void CheckOverflow(bool overflow) {
  if (overflow) throw Error("integer overflow");
}

Value Repeat(const Value& seq, int64_t count) {
  if (count < 0) count = 0;
  if (seq.is_string()) {
    if (seq.str().size() * static_cast<size_t>(count) > kMaxRepeatBytes) {
      throw Error("string repetition result too large");
    }
    std::string out;
    for (int64_t i = 0; i < count; ++i) out += seq.str();
    return Value::MakeString(std::move(out));
  }
  if (seq.items().size() * static_cast<size_t>(count) > kMaxRepeatBytes / 16) {
    throw Error("sequence repetition result too large");
  }
  ValueList out;
  for (int64_t i = 0; i < count; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_list() ? Value::MakeList(std::move(out)) : Value::MakeTuple(std::move(out));
}

double FloatFloorDiv(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  double div = (vx - mod) / wx;
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) div -= 1.0;
  }
  if (div != 0.0) {
    double floordiv = std::floor(div);
    if (div - floordiv > 0.5) floordiv += 1.0;
    return floordiv;
  }
  return std::copysign(0.0, vx / wx);
}

double FloatMod(double vx, double wx) {
  double mod = std::fmod(vx, wx);
  if (mod != 0.0) {
    if ((wx < 0) != (mod < 0)) mod += wx;
  } else {
    mod = std::copysign(0.0, wx);
  }
  return mod;
}

Value Arithmetic(Op op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) Unsupported(op, a, b);
  if (a.is_integral() && b.is_integral() && op != Op::kDiv) {
    const int64_t x = a.int_value();
    const int64_t y = b.int_value();
    int64_t r = 0;
    switch (op) {
      case Op::kAdd:
        CheckOverflow(__builtin_add_overflow(x, y, &r));
        return Value::MakeInt(r);
      case Op::kSub:
        CheckOverflow(__builtin_sub_overflow(x, y, &r));
        return Value::MakeInt(r);
      case Op::kMul:
        CheckOverflow(__builtin_mul_overflow(x, y, &r));
        return Value::MakeInt(r);
      case Op::kFloorDiv:
      case Op::kMod: {
        if (y == 0) throw Error("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) throw Error("integer overflow");
        int64_t q = x / y;
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::MakeInt(op == Op::kFloorDiv ? q : m);
      }
      case Op::kPow: {
        if (y < 0) {
          if (x == 0) throw Error("0.0 cannot be raised to a negative power");
          return Value::MakeFloat(std::pow(static_cast<double>(x), static_cast<double>(y)));
        }
        int64_t result = 1;
        int64_t base = x;
        int64_t e = y;
        while (e > 0) {
          if (e & 1) CheckOverflow(__builtin_mul_overflow(result, base, &result));
          e >>= 1;
          if (e > 0) CheckOverflow(__builtin_mul_overflow(base, base, &base));
        }
        return Value::MakeInt(result);
      }
      default:
        break;
    }
  }
  const double x = a.AsDouble();
  const double y = b.AsDouble();
  switch (op) {
    case Op::kAdd:
      return Value::MakeFloat(x + y);
    case Op::kSub:
      return Value::MakeFloat(x - y);
    case Op::kMul:
      return Value::MakeFloat(x * y);
    case Op::kDiv:
      if (y == 0) throw Error("division by zero");
      return Value::MakeFloat(x / y);
    case Op::kFloorDiv:
      if (y == 0) throw Error("float floor division by zero");
      return Value::MakeFloat(FloatFloorDiv(x, y));
    case Op::kMod:
      if (y == 0) throw Error("float modulo");
      return Value::MakeFloat(FloatMod(x, y));
    case Op::kPow:
      if (x == 0 && y < 0) throw Error("0.0 cannot be raised to a negative power");
      if (x < 0 && std::floor(y) != y) throw Error("complex results are not supported");
      return Value::MakeFloat(std::pow(x, y));
    default:
      Unsupported(op, a, b);
  }
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Kind::kUndefined:
      return false;
    case Kind::kString:
      if (!item.is_string()) {
        if (item.is_undefined()) ThrowUndefined(item);
        throw Error("'in <string>' requires string as left operand, not " + TypeName(item));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Kind::kList:
    case Kind::kTuple:
    case Kind::kIterator:
      for (const Value& v : container.items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Kind::kDict:
      if (item.is_list() || item.is_dict())
        throw Error("unhashable type: " + py::Repr(TypeName(item)));
      return container.dict().Find(item) != nullptr;
    default:
      throw Error("argument of type " + py::Repr(TypeName(container)) + " is not iterable");
  }
}

bool Ordered(Op op, const Value& a, const Value& b) {
  if (a.is_undefined()) ThrowUndefined(a);
  if (b.is_undefined()) ThrowUndefined(b);
  auto from_cmp = [op](int c) {
    switch (op) {
      case Op::kLt:
        return c < 0;
      case Op::kLe:
        return c <= 0;
      case Op::kGt:
        return c > 0;
      default:
        return c >= 0;
    }
  };
  if (a.is_number() && b.is_number()) {
    if (a.is_integral() && b.is_integral()) {
      const int64_t x = a.int_value();
      const int64_t y = b.int_value();
      return from_cmp(x < y ? -1 : x > y ? 1 : 0);
    }
    const double x = a.AsDouble();
    const double y = b.AsDouble();
    switch (op) {  // NaN compares false everywhere
      case Op::kLt:
        return x < y;
      case Op::kLe:
        return x <= y;
      case Op::kGt:
        return x > y;
      default:
        return x >= y;
    }
  }
  if (a.is_string() && b.is_string()) return from_cmp(a.str().compare(b.str()));
  if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
    const ValueList& x = a.items();
    const ValueList& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equals(x[i], y[i])) return Ordered(op, x[i], y[i]);
    }
    return from_cmp(x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0);
  }
  throw Error(std::string("'") + OpSymbol(op) + "' not supported between instances of " +
              py::Repr(TypeName(a)) + " and " + py::Repr(TypeName(b)));
}

}  // namespace

Value Interp::BinaryOp(Op op, const Value& a, const Value& b) {
  if (op == Op::kConcat) {
    std::string s = ToStr(a);
    AppendStr(s, b);
    if (s.size() > limits_.max_output_bytes) throw Error("string too large");
    return Value::MakeString(std::move(s));
  }
  if (a.is_undefined()) ThrowUndefined(a);
  if (b.is_undefined()) ThrowUndefined(b);
  switch (op) {
    case Op::kAdd:
      if (a.is_string() || b.is_string()) {
        if (!a.is_string() || !b.is_string()) {
          if (!a.is_string()) Unsupported(op, a, b);
          throw Error("can only concatenate str (not \"" + TypeName(b) + "\") to str");
        }
        if (a.str().size() + b.str().size() > limits_.max_output_bytes) {
          throw Error("string too large");
        }
        return Value::MakeString(a.str() + b.str());
      }
      if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
        ValueList out = a.items();
        out.insert(out.end(), b.items().begin(), b.items().end());
        return a.is_list() ? Value::MakeList(std::move(out)) : Value::MakeTuple(std::move(out));
      }
      if (a.is_list() || a.is_tuple()) {
        throw Error("can only concatenate " + TypeName(a) + " (not \"" + TypeName(b) + "\") to " +
                    TypeName(a));
      }
      return Arithmetic(op, a, b);
    case Op::kMul:
      if ((a.is_string() || a.is_list() || a.is_tuple()) && b.is_integral()) {
        return Repeat(a, b.int_value());
      }
      if ((b.is_string() || b.is_list() || b.is_tuple()) && a.is_integral()) {
        return Repeat(b, a.int_value());
      }
      if (a.is_string() || b.is_string() || a.has_items() || b.has_items()) {
        throw Error("can't multiply sequence by non-int of type " + py::Repr(TypeName(b)));
      }
      return Arithmetic(op, a, b);
    case Op::kMod:
      if (a.is_string()) return Value::MakeString(PercentFormat(a.str(), b));
      return Arithmetic(op, a, b);
    default:
      return Arithmetic(op, a, b);
  }
}

bool Interp::CompareOp(Op op, const Value& a, const Value& b) {
  switch (op) {
    case Op::kEq:
      return Equals(a, b);
    case Op::kNe:
      return !Equals(a, b);
    case Op::kIn:
      return Contains(b, a);
    case Op::kNotIn:
      return !Contains(b, a);
    default:
      return Ordered(op, a, b);
  }
}

// ---------------------------------------------------------------- printf-style formatting

std::string PercentFormat(const std::string& fmt, const Value& args) {
  const bool is_mapping = args.is_dict();
  ValueList positional;
  if (args.is_tuple()) {
    positional = args.items();
  } else if (!is_mapping) {
    positional.push_back(args);
  }
  size_t next_arg = 0;
  auto take = [&]() -> const Value& {
    if (next_arg >= positional.size()) throw Error("not enough arguments for format string");
    return positional[next_arg++];
  };
  std::string out;
  size_t i = 0;
  while (i < fmt.size()) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i++]);
      continue;
    }
    ++i;
    if (i >= fmt.size()) throw Error("incomplete format");
    const Value* value = nullptr;
    Value mapped;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos) throw Error("incomplete format key");
      if (!is_mapping) throw Error("format requires a mapping");
      const Value* v = args.dict().FindString(fmt.substr(i + 1, close - i - 1));
      if (v == nullptr) throw Error("KeyError: " + py::Repr(fmt.substr(i + 1, close - i - 1)));
      mapped = *v;
      value = &mapped;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
      flags.push_back(fmt[i++]);
    }
    int64_t width = -1;
    int64_t precision = -1;
    if (i < fmt.size() && fmt[i] == '*') {
      width = ToInt(take(), "* width");
      ++i;
    } else {
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        width = std::max<int64_t>(width, 0) * 10 + (fmt[i++] - '0');
        if (width > 100000) throw Error("width too big");
      }
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      precision = 0;
      if (i < fmt.size() && fmt[i] == '*') {
        precision = ToInt(take(), "* precision");
        ++i;
      } else {
        while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
          precision = precision * 10 + (fmt[i++] - '0');
          if (precision > 1000) throw Error("precision too big");
        }
      }
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) throw Error("incomplete format");
    const char conv = fmt[i++];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (value == nullptr) value = &take();
    if (value->is_undefined() && conv != 's') ThrowUndefined(*value);
    const bool left = flags.find('-') != std::string::npos;
    std::string piece;
    switch (conv) {
      case 's':
      case 'r':
      case 'a': {
        piece = conv == 's' ? ToStr(*value) : ToRepr(*value);
        if (precision >= 0) {
          const std::u32string u = py::Decode(piece);
          if (static_cast<int64_t>(u.size()) > precision) {
            piece = py::Encode(u.substr(0, static_cast<size_t>(precision)));
          }
        }
        break;
      }
      case 'c':
        if (value->is_string() && py::Length(value->str()) == 1) {
          piece = value->str();
        } else if (value->is_integral()) {
          py::AppendUtf8(piece, static_cast<char32_t>(value->int_value()));
        } else {
          throw Error("%c requires int or char");
        }
        break;
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        if (!value->is_number()) {
          throw Error(std::string("%") + conv + " format: a real number is required, not " +
                      TypeName(*value));
        }
        if (value->is_float() && conv != 'd' && conv != 'i' && conv != 'u') {
          throw Error(std::string("%") + conv + " format: an integer is required, not float");
        }
        const int64_t n =
            value->is_float() ? static_cast<int64_t>(value->float_value()) : value->int_value();
        std::string spec = "%" + flags;
        if (precision >= 0) spec += "." + std::to_string(precision);
        const char c = conv == 'i' || conv == 'u' ? 'd' : conv;
        spec += "ll";
        spec.push_back(c);
        char buf[128];
        std::snprintf(buf, sizeof(buf), spec.c_str(), static_cast<long long>(n));
        piece = buf;
        if (conv == 'o' && flags.find('#') != std::string::npos) {
          // C prints "0" + digits for %#o; Python prints "0o" + digits.
          const size_t p = piece.find_first_of("0123456789");
          if (p != std::string::npos) piece.replace(p, 1, "0o");
        }
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!value->is_number()) {
          throw Error(std::string("must be real number, not ") + TypeName(*value));
        }
        std::string spec = "%" + flags;
        spec += "." + std::to_string(precision >= 0 ? precision : 6);
        spec.push_back(conv);
        std::vector<char> buf(static_cast<size_t>(precision >= 0 ? precision : 6) + 400);
        std::snprintf(buf.data(), buf.size(), spec.c_str(), value->AsDouble());
        piece = buf.data();
        break;
      }
      default:
        throw Error(std::string("unsupported format character '") + conv + "'");
    }
    const auto len = static_cast<int64_t>(py::Length(piece));
    if (width > len) {
      const bool zero = flags.find('0') != std::string::npos && !left && conv != 's' &&
                        conv != 'r' && conv != 'a' && conv != 'c';
      if (left) {
        piece.append(static_cast<size_t>(width - len), ' ');
      } else if (zero) {
        size_t sign_len =
            (!piece.empty() && (piece[0] == '-' || piece[0] == '+' || piece[0] == ' ')) ? 1 : 0;
        piece.insert(sign_len, static_cast<size_t>(width - len), '0');
      } else {
        piece.insert(0, static_cast<size_t>(width - len), ' ');
      }
    }
    out += piece;
  }
  if (!is_mapping && next_arg < positional.size()) {
    throw Error("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace kestrel::jinja
