// Bounded integers and decimals as digit-by-digit expressions.
//
// A number splits by sign into magnitudes; a magnitude into its integer digits (a range of
// canonical integers: one alternative per digit count, each split at the first differing digit)
// and its fraction digits (compared left to right with the bound's fraction: while a prefix equals
// the bound's, the next digit is limited by the bound's digit; once it differs, anything follows).
#include "grammar/json_schema_numbers.h"

#include <algorithm>
#include <cctype>
#include <vector>

namespace kestrel::grammar::json_numbers {
namespace {

Expr Digits(char lo, char hi) {
  return Expr::Class(CodepointSet::Of({{uint32_t(lo), uint32_t(hi)}}));
}
Expr AnyDigit() {
  return Digits('0', '9');
}

bool AllOf(std::string_view s, char c) {
  return std::all_of(s.begin(), s.end(), [c](char x) { return x == c; });
}

// Compares canonical integer digit strings.
int CompareInt(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a.compare(b) < 0 ? -1 : a == b ? 0 : 1;
}

// Compares magnitudes (signs ignored). Normalised fractions compare lexicographically.
int CompareMagnitude(const Decimal& a, const Decimal& b) {
  const int c = CompareInt(a.int_digits, b.int_digits);
  if (c != 0) return c;
  return a.frac_digits.compare(b.frac_digits) < 0 ? -1 : a.frac_digits == b.frac_digits ? 0 : 1;
}

std::string Increment(std::string s) {
  int i = static_cast<int>(s.size()) - 1;
  while (i >= 0 && s[i] == '9') s[i--] = '0';
  if (i < 0) {
    s.insert(s.begin(), '1');
    return s;
  }
  ++s[i];
  return s;
}

// s > "0".
std::string Decrement(std::string s) {
  int i = static_cast<int>(s.size()) - 1;
  while (s[i] == '0') s[i--] = '9';
  --s[i];
  if (s.size() > 1 && s[0] == '0') s.erase(0, 1);
  return s;
}

// Canonical integers in [a, b], both of length n >= 1.
Expr SameLengthRange(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (a == b) return Expr::Literal(a);
  if (n == 1) return Digits(a[0], b[0]);
  const std::string a_rest = a.substr(1);
  const std::string b_rest = b.substr(1);
  if (a[0] == b[0])
    return Expr::Sequence({Expr::Literal(a.substr(0, 1)), SameLengthRange(a_rest, b_rest)});
  std::vector<Expr> alternatives;
  char middle_lo = static_cast<char>(a[0] + 1);
  char middle_hi = static_cast<char>(b[0] - 1);
  if (AllOf(a_rest, '0')) {
    middle_lo = a[0];
  } else {
    alternatives.push_back(Expr::Sequence(
        {Expr::Literal(a.substr(0, 1)), SameLengthRange(a_rest, std::string(n - 1, '9'))}));
  }
  if (AllOf(b_rest, '9')) middle_hi = b[0];
  if (middle_lo <= middle_hi) {
    alternatives.push_back(
        Expr::Sequence({Digits(middle_lo, middle_hi),
                        Expr::Repeat(AnyDigit(), uint32_t(n - 1), uint32_t(n - 1))}));
  }
  if (!AllOf(b_rest, '9')) {
    alternatives.push_back(Expr::Sequence(
        {Expr::Literal(b.substr(0, 1)), SameLengthRange(std::string(n - 1, '0'), b_rest)}));
  }
  return Expr::Choice(std::move(alternatives));
}

// Canonical integer texts in [lo, hi] (hi nullopt: no upper bound).
std::optional<Expr> IntRange(std::string lo, const std::optional<std::string>& hi) {
  if (hi && CompareInt(*hi, lo) < 0) return std::nullopt;
  std::vector<Expr> alternatives;
  if (lo == "0") {
    alternatives.push_back(Expr::Literal("0"));
    if (hi && *hi == "0") return alternatives[0];
    lo = "1";
  }
  for (size_t len = lo.size();; ++len) {
    if (hi && len > hi->size()) break;
    if (!hi && len > lo.size()) {  // every longer number
      alternatives.push_back(Expr::Sequence(
          {Digits('1', '9'), Expr::Repeat(AnyDigit(), uint32_t(len - 1), kUnbounded)}));
      break;
    }
    std::string a = lo;
    if (len != lo.size()) {  // 10...0
      a.assign(len, '0');
      a[0] = '1';
    }
    const std::string b = hi && len == hi->size() ? *hi : std::string(len, '9');
    alternatives.push_back(SameLengthRange(a, b));
  }
  return Expr::Choice(std::move(alternatives));
}

// Fraction digits against a lower bound l (strict: sl) and an optional upper bound h (sh), both
// normalised (no trailing zeros); the value compared is 0.<digits>.
struct FractionBounds {
  std::string l;
  bool sl = false;
  std::optional<std::string> h;
  bool sh = false;

  // The digits may end at position i given whether they still equal l's / h's prefix.
  bool EndAllowed(size_t i, bool tight_lo, bool tight_hi) const {
    if (tight_lo && !(i >= l.size() && !sl)) return false;
    if (tight_hi && i >= h->size() && sh) return false;
    return true;
  }

  // Non-empty digit strings from position i on.
  std::optional<Expr> NonEmpty(size_t i, bool tight_lo, bool tight_hi) const {
    const bool lo_done = tight_lo && i >= l.size();  // l's remaining digits are zeros
    const bool hi_done = tight_hi && i >= h->size();
    if (!tight_lo && !tight_hi) return Expr::Plus(AnyDigit());
    if (lo_done && !tight_hi) {
      if (!sl) return Expr::Plus(AnyDigit());
      return Expr::Sequence({Expr::Star(AnyDigit()), Digits('1', '9'), Expr::Star(AnyDigit())});
    }
    if (hi_done && !tight_lo) {
      if (sh) return std::nullopt;
      return Expr::Plus(Expr::Literal("0"));
    }
    if (lo_done && hi_done) {
      if (sl || sh) return std::nullopt;
      return Expr::Plus(Expr::Literal("0"));
    }
    const int ld = tight_lo ? (i < l.size() ? l[i] - '0' : 0) : -1;
    const int hd = tight_hi ? (i < h->size() ? (*h)[i] - '0' : 0) : 10;
    std::vector<Expr> alternatives;
    int d = std::max(ld, 0);
    while (d <= std::min(hd, 9)) {
      const bool next_lo = tight_lo && d == ld;
      const bool next_hi = tight_hi && d == hd;
      // Digits sharing (next_lo, next_hi): a single tight digit, or the loose run up to the next.
      int end = d;
      if (!next_lo && !next_hi) {
        while (end + 1 <= std::min(hd, 9) && end + 1 != hd) ++end;
      }
      std::vector<Expr> tail;
      if (EndAllowed(i + 1, next_lo, next_hi)) tail.push_back(Expr::Empty());
      if (auto more = NonEmpty(i + 1, next_lo, next_hi)) tail.push_back(std::move(*more));
      if (!tail.empty()) {
        alternatives.push_back(
            Expr::Sequence({Digits(static_cast<char>('0' + d), static_cast<char>('0' + end)),
                            Expr::Choice(std::move(tail))}));
      }
      d = end + 1;
    }
    if (alternatives.empty()) return std::nullopt;
    return Expr::Choice(std::move(alternatives));
  }

  // "" (value 0) or "." digits, within the bounds.
  std::optional<Expr> Text() const {
    const bool tight_lo = !(l.empty() && !sl);
    const bool tight_hi = h.has_value();
    std::vector<Expr> alternatives;
    if (EndAllowed(0, tight_lo, tight_hi)) alternatives.push_back(Expr::Empty());
    if (auto digits = NonEmpty(0, tight_lo, tight_hi)) {
      alternatives.push_back(Expr::Sequence({Expr::Literal("."), std::move(*digits)}));
    }
    if (alternatives.empty()) return std::nullopt;
    return Expr::Choice(std::move(alternatives));
  }
};

Expr AnyFraction() {
  return Expr::Optional(Expr::Sequence({Expr::Literal("."), Expr::Plus(AnyDigit())}));
}

// Non-negative decimal texts (no sign) between two magnitudes.
std::optional<Expr> MagnitudeDecimal(const Bound& lo, const std::optional<Bound>& hi) {
  const std::string& li = lo.value.int_digits;
  if (hi) {
    const int c = CompareMagnitude(lo.value, hi->value);
    if (c > 0 || (c == 0 && (lo.exclusive || hi->exclusive))) return std::nullopt;
    if (li == hi->value.int_digits) {
      FractionBounds f{lo.value.frac_digits, lo.exclusive, hi->value.frac_digits, hi->exclusive};
      auto text = f.Text();
      if (!text) return std::nullopt;
      return Expr::Sequence({Expr::Literal(li), std::move(*text)});
    }
  }
  std::vector<Expr> alternatives;
  if (auto f = FractionBounds{lo.value.frac_digits, lo.exclusive, std::nullopt, false}.Text()) {
    alternatives.push_back(Expr::Sequence({Expr::Literal(li), std::move(*f)}));
  }
  std::optional<std::string> middle_hi;
  if (hi) middle_hi = hi->value.int_digits == "0" ? "" : Decrement(hi->value.int_digits);
  if (!middle_hi || !middle_hi->empty()) {
    if (auto middle = IntRange(Increment(li), middle_hi)) {
      alternatives.push_back(Expr::Sequence({std::move(*middle), AnyFraction()}));
    }
  }
  if (hi) {
    if (auto f = FractionBounds{"", false, hi->value.frac_digits, hi->exclusive}.Text()) {
      alternatives.push_back(Expr::Sequence({Expr::Literal(hi->value.int_digits), std::move(*f)}));
    }
  }
  if (alternatives.empty()) return std::nullopt;
  return Expr::Choice(std::move(alternatives));
}

// Non-negative canonical integer texts between two magnitudes.
std::optional<Expr> MagnitudeInteger(const Bound& lo, const std::optional<Bound>& hi) {
  std::string lo_int = lo.value.int_digits;
  if (!lo.value.frac_digits.empty() || lo.exclusive) lo_int = Increment(lo_int);
  std::optional<std::string> hi_int;
  if (hi) {
    hi_int = hi->value.int_digits;
    if (hi->value.frac_digits.empty() && hi->exclusive) {
      if (*hi_int == "0") return std::nullopt;
      hi_int = Decrement(*hi_int);
    }
  }
  return IntRange(lo_int, hi_int);
}

using MagnitudeRange = std::optional<Expr> (*)(const Bound&, const std::optional<Bound>&);

bool IsZero(const Decimal& d) {
  return d.int_digits == "0" && d.frac_digits.empty();
}

// Splits [lo, hi] by sign: x >= 0 directly, x < 0 as "-" and the magnitude -x in [-hi, -lo].
// "-0" is never produced (0 belongs to the non-negative side).
std::optional<Expr> SignedRange(const std::optional<Bound>& lo, const std::optional<Bound>& hi,
                                MagnitudeRange magnitude) {
  std::vector<Expr> alternatives;
  if (!hi || !hi->value.negative) {
    Bound mag_lo;  // 0 inclusive
    if (lo && !lo->value.negative) mag_lo = *lo;
    if (auto e = magnitude(mag_lo, hi)) alternatives.push_back(std::move(*e));
  }
  if (!lo || lo->value.negative) {
    Bound mag_lo{Decimal{}, true};  // > 0
    if (hi && (hi->value.negative || IsZero(hi->value))) {
      mag_lo = {hi->value, hi->exclusive || IsZero(hi->value)};
      mag_lo.value.negative = false;
    }
    std::optional<Bound> mag_hi;
    if (lo) {
      mag_hi = *lo;
      mag_hi->value.negative = false;
    }
    if (auto e = magnitude(mag_lo, mag_hi)) {
      alternatives.push_back(Expr::Sequence({Expr::Literal("-"), std::move(*e)}));
    }
  }
  if (alternatives.empty()) return std::nullopt;
  return Expr::Choice(std::move(alternatives));
}

}  // namespace

Result<Decimal> ParseDecimal(const nlohmann::ordered_json& value) {
  std::string text;
  if (value.is_number_integer() || value.is_number_unsigned() || value.is_number_float()) {
    text = value.dump();
  } else {
    return InvalidArgument("not a number");
  }
  size_t i = 0;
  Decimal d;
  if (text[i] == '-') {
    d.negative = true;
    ++i;
  }
  std::string digits;
  int64_t point = -1;
  for (; i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.');
       ++i) {
    if (text[i] == '.') {
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += text[i];
    }
  }
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    const int64_t exponent = std::stoll(text.substr(i + 1));
    if (exponent > 400 || exponent < -400) return OutOfRange("number bound out of range: " + text);
    point += exponent;
  }
  if (point <= 0) {
    d.int_digits = "0";
    d.frac_digits = std::string(static_cast<size_t>(-point), '0') + digits;
  } else {
    if (point > static_cast<int64_t>(digits.size())) digits.append(point - digits.size(), '0');
    d.int_digits = digits.substr(0, point);
    d.frac_digits = digits.substr(point);
  }
  d.int_digits.erase(0, std::min(d.int_digits.find_first_not_of('0'), d.int_digits.size() - 1));
  while (!d.frac_digits.empty() && d.frac_digits.back() == '0') d.frac_digits.pop_back();
  if (IsZero(d)) d.negative = false;
  return d;
}

bool Tighter(const Bound& a, const Bound& b, bool lower) {
  int c = 0;
  if (a.value.negative != b.value.negative) {
    c = a.value.negative ? -1 : 1;
  } else {
    c = CompareMagnitude(a.value, b.value) * (a.value.negative ? -1 : 1);
  }
  if (c == 0) return a.exclusive && !b.exclusive;
  return lower ? c > 0 : c < 0;
}

std::optional<Expr> IntegerInRange(const std::optional<Bound>& lo, const std::optional<Bound>& hi) {
  if (!lo && !hi) return AnyInteger();
  return SignedRange(lo, hi, MagnitudeInteger);
}

std::optional<Expr> DecimalInRange(const std::optional<Bound>& lo, const std::optional<Bound>& hi) {
  if (!lo && !hi) return AnyNumber();
  return SignedRange(lo, hi, MagnitudeDecimal);
}

Expr AnyInteger() {
  return Expr::Sequence(
      {Expr::Optional(Expr::Literal("-")),
       Expr::Choice(
           {Expr::Literal("0"), Expr::Sequence({Digits('1', '9'), Expr::Star(AnyDigit())})})});
}

Expr AnyNumber() {
  return Expr::Sequence(
      {AnyInteger(), AnyFraction(),
       Expr::Optional(
           Expr::Sequence({Expr::Class(CodepointSet::Of({{'e', 'e'}, {'E', 'E'}})),
                           Expr::Optional(Expr::Class(CodepointSet::Of({{'+', '+'}, {'-', '-'}}))),
                           Expr::Plus(AnyDigit())}))});
}

}  // namespace kestrel::grammar::json_numbers
