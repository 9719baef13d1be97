// Exact bounded JSON numbers: the texts of integers and decimals within [minimum, maximum]
// (either bound optional, inclusive or exclusive), built digit by digit. Internal to the JSON
// Schema front-end.
//
// Enforced exactly, for bounds of any size and precision: an integer's text is -?(0|[1-9][0-9]*)
// and its value lies in the bounds; a bounded number's text is -?(0|[1-9][0-9]*)(\.[0-9]+)? (no
// exponent) and its exact decimal value lies in the bounds. Zero is written without a sign.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "core/status.h"
#include "grammar/grammar.h"

namespace kestrel::grammar::json_numbers {

// An exact decimal: [-]int_digits[.frac_digits], int_digits without leading zeros ("0" for zero),
// frac_digits without trailing zeros. Zero is never negative.
struct Decimal {
  bool negative = false;
  std::string int_digits = "0";
  std::string frac_digits;
};

// Reads a JSON number exactly as written in the schema (its shortest round-trip text).
Result<Decimal> ParseDecimal(const nlohmann::ordered_json& value);

struct Bound {
  Decimal value;
  bool exclusive = false;
};

// Whether a is a tighter lower (lower = true) or upper bound than b.
bool Tighter(const Bound& a, const Bound& b, bool lower);

// nullopt when no text lies in the bounds.
std::optional<Expr> IntegerInRange(const std::optional<Bound>& lo, const std::optional<Bound>& hi);
std::optional<Expr> DecimalInRange(const std::optional<Bound>& lo, const std::optional<Bound>& hi);

// Unbounded JSON texts.
Expr AnyInteger();
Expr AnyNumber();  // with optional fraction and exponent

}  // namespace kestrel::grammar::json_numbers
