// Python's float repr and int() / float() parsing of strings.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "tokenizer/jinja/pystr.h"

namespace kestrel::jinja::py {

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then CPython's 'r' layout: fixed notation when the decimal
  // exponent lies in (-4, 16], otherwise d.ddde±XX.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::atoi(sci.c_str() + e_pos + 1);
  const int decpt = exp10 + 1;
  const int n_digits = static_cast<int>(digits.size());
  std::string out = sign;
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (decpt >= n_digits) {
      out += digits + std::string(static_cast<size_t>(decpt - n_digits), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." +
             digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (n_digits > 1) out += "." + digits.substr(1);
  const int e = decpt - 1;
  std::snprintf(buf, sizeof(buf), "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  out += buf;
  return out;
}

// ---------------------------------------------------------------- number parsing

namespace {

int DigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

std::string_view TrimSpace(std::string_view s) {
  size_t b = 0;
  while (b < s.size() && SpaceBytes(s, b) > 0) b += SpaceBytes(s, b);
  size_t e = s.size();
  while (e > b) {
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (SpaceBytes(s, start) == 0) break;
    e = start;
  }
  return s.substr(b, e - b);
}

// Removes single underscores that sit between two digits; nullopt if misplaced.
std::optional<std::string> StripUnderscores(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '_') {
      out.push_back(s[i]);
      continue;
    }
    if (i == 0 || i + 1 >= s.size() || DigitValue(s[i - 1]) > 35 || DigitValue(s[i + 1]) > 35) {
      return std::nullopt;
    }
  }
  return out;
}

}  // namespace

std::optional<int64_t> ParseInt(std::string_view text, int base) {
  std::string_view s = TrimSpace(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.size() >= 2 && s[0] == '0') {
    const char p = static_cast<char>(s[1] | 0x20);
    const int prefix_base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefix_base != 0 && (base == 0 || base == prefix_base)) {
      base = prefix_base;
      s.remove_prefix(2);
      if (!s.empty() && s[0] == '_') s.remove_prefix(1);
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || s.empty()) return std::nullopt;
  const auto cleaned = StripUnderscores(s);
  if (!cleaned || cleaned->empty()) return std::nullopt;
  int64_t value = 0;
  for (char c : *cleaned) {
    const int d = DigitValue(c);
    if (d >= base) return std::nullopt;
    if (__builtin_mul_overflow(value, base, &value) || __builtin_add_overflow(value, d, &value)) {
      return std::nullopt;
    }
  }
  return negative ? -value : value;
}

std::optional<double> ParseFloat(std::string_view text) {
  std::string_view s = TrimSpace(text);
  std::string lower = Lower(s);
  std::string_view body = lower;
  bool negative = false;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) {
    negative = body[0] == '-';
    body.remove_prefix(1);
  }
  if (body == "inf" || body == "infinity") {
    return negative ? -std::numeric_limits<double>::infinity()
                    : std::numeric_limits<double>::infinity();
  }
  if (body == "nan") return std::numeric_limits<double>::quiet_NaN();
  // [digits][.digits][e[+-]digits] with at least one mantissa digit.
  size_t i = 0;
  size_t n_mantissa = 0;
  auto digits = [&]() {
    size_t n = 0;
    while (i < body.size() && ((body[i] >= '0' && body[i] <= '9') || body[i] == '_')) {
      ++i;
      ++n;
    }
    return n;
  };
  n_mantissa += digits();
  if (i < body.size() && body[i] == '.') {
    ++i;
    n_mantissa += digits();
  }
  if (n_mantissa == 0) return std::nullopt;
  if (i < body.size() && body[i] == 'e') {
    ++i;
    if (i < body.size() && (body[i] == '+' || body[i] == '-')) ++i;
    if (digits() == 0) return std::nullopt;
  }
  if (i != body.size()) return std::nullopt;
  std::string cleaned;
  for (size_t k = 0; k < body.size(); ++k) {
    if (body[k] != '_') {
      cleaned.push_back(body[k]);
      continue;
    }
    const bool ok = k > 0 && k + 1 < body.size() && body[k - 1] >= '0' && body[k - 1] <= '9' &&
                    body[k + 1] >= '0' && body[k + 1] <= '9';
    if (!ok) return std::nullopt;
  }
  const double v = std::strtod(cleaned.c_str(), nullptr);
  return negative ? -v : v;
}

}  // namespace kestrel::jinja::py
