#include "cli/common.h"

#include <cstdlib>
#include <iostream>

#include "core/gguf.h"
#include "core/mapped_file.h"

namespace kestrel::cli {

std::string ResolveModelDir(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("KESTREL_MODEL"); env != nullptr && env[0] != '\0') return env;
  return "models/kestrel-tiny";
}

Status CheckModelDir(const std::string& dir) {
  if (IsGgufFile(dir)) return Status::Ok();
  if (!IsDirectory(dir)) {
    return NotFound(dir + ": model directory or GGUF file not found (pass --model DIR|FILE.gguf "
                    "or set KESTREL_MODEL)");
  }
  return Status::Ok();
}

int Fail(const Status& status) { return Fail(status.message()); }

int Fail(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr, "kestrel: error: %s\n", message.c_str());
  return 1;
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

void WriteLine(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace kestrel::cli
