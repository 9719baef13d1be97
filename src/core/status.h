// Status and Result<T>: the error path for bad input (a flag, a request, a model file).
// Bugs and broken invariants use KCHECK (check.h) instead.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace kestrel {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // malformed input: JSON, flag, request field
  kNotFound,           // missing file, tensor, key
  kIoError,            // read/mmap failure
  kUnsupported,        // valid but not supported (architecture, dtype, feature)
  kOutOfRange,         // offsets, sizes, context length
  kResourceExhausted,  // memory budget, queue full
  kUnavailable,        // shutting down
  kCancelled,          // the client went away
  kInternal,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prefixes context ("config.json: ") to the message; keeps the code.
  Status With(const std::string& context) const {
    if (ok()) return *this;
    return Status(code_, context + message_);
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kestrel

// Propagates a non-ok Status from an expression returning Status.
#define KTRY(expr)                                \
  do {                                            \
    ::kestrel::Status kestrel_status_ = (expr);   \
    if (!kestrel_status_.ok()) return kestrel_status_; \
  } while (0)

#define KESTREL_CONCAT_INNER(a, b) a##b
#define KESTREL_CONCAT(a, b) KESTREL_CONCAT_INNER(a, b)
// Assigns the value of a Result<T> expression to lhs or returns its Status.
#define KASSIGN(lhs, expr) KASSIGN_IMPL(KESTREL_CONCAT(kestrel_result_, __LINE__), lhs, expr)
#define KASSIGN_IMPL(tmp, lhs, expr)       \
  auto tmp = (expr);                       \
  if (!tmp.ok()) return tmp.status();      \
  lhs = std::move(tmp).value()
