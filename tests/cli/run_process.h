// Runs the built `kestrel` binary as a child process with the given stdin, capturing stdout,
// stderr and the exit code: the CLI is checked from outside, as users drive it.
#pragma once

#include <string>
#include <vector>

namespace kestrel::testing {

struct ProcessResult {
  int exit_code = -1;  // 128 + signal when killed by a signal
  std::string out;
  std::string err;
};

ProcessResult RunKestrel(const std::vector<std::string>& args, const std::string& stdin_text = "");

}  // namespace kestrel::testing
