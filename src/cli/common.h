// Shared helpers of the CLI verbs: model directory resolution, JSON-lines I/O, error exit.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace kestrel::cli {

// --model, else $KESTREL_MODEL, else models/kestrel-tiny relative to the working directory.
std::string ResolveModelDir(const std::string& flag_value);

// Fails with a readable Status when dir is missing or not a directory.
Status CheckModelDir(const std::string& dir);

// Prints "kestrel: error: <message>" on stderr; returns the process exit code (1).
int Fail(const Status& status);
int Fail(const std::string& message);

// JSON text that never throws on invalid UTF-8 (replaced by U+FFFD), non-ASCII kept raw.
std::string DumpJson(const nlohmann::json& j);

// Writes one line to stdout and flushes (JSON-lines protocols are interactive).
void WriteLine(const std::string& line);

}  // namespace kestrel::cli
