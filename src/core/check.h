// KCHECK: aborts with file and line on a broken invariant (a bug, never bad input).
#pragma once

#include <cstdio>
#include <cstdlib>

namespace kestrel::detail {
[[noreturn]] inline void CheckFailed(const char* file, int line, const char* cond, const char* msg) {
  std::fprintf(stderr, "KCHECK failed at %s:%d: %s%s%s\n", file, line, cond, msg[0] ? " — " : "",
               msg);
  std::fflush(stderr);
  std::abort();
}
}  // namespace kestrel::detail

#define KCHECK(cond)                                                              \
  do {                                                                            \
    if (!(cond)) [[unlikely]] ::kestrel::detail::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)

#define KCHECK_MSG(cond, msg)                                                      \
  do {                                                                             \
    if (!(cond)) [[unlikely]] ::kestrel::detail::CheckFailed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
