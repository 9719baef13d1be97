// The `kestrel` verbs. Each Register* adds a CLI11 subcommand whose callback sets the exit code.
#pragma once

#include <CLI/CLI.hpp>

namespace kestrel::cli {

void RegisterGenerate(CLI::App& app, int& exit_code);
void RegisterTokenize(CLI::App& app, int& exit_code);
void RegisterRenderChat(CLI::App& app, int& exit_code);
void RegisterLogits(CLI::App& app, int& exit_code);
void RegisterInfo(CLI::App& app, int& exit_code);
void RegisterBench(CLI::App& app, int& exit_code);
void RegisterServe(CLI::App& app, int& exit_code);
void RegisterBenchServe(CLI::App& app, int& exit_code);

}  // namespace kestrel::cli
