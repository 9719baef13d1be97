// kestrel: one binary, one verb per job (serve, generate, tokenize, render-chat, logits, info,
// bench, bench-serve).
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "cli/common.h"
#include "cli/verbs.h"

int main(int argc, char** argv) {
  CLI::App app{"Kestrel: exact LLM inference for Hugging Face model directories"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kestrel 0.1.0");
  int exit_code = 0;
  kestrel::cli::RegisterGenerate(app, exit_code);
  kestrel::cli::RegisterTokenize(app, exit_code);
  kestrel::cli::RegisterRenderChat(app, exit_code);
  kestrel::cli::RegisterLogits(app, exit_code);
  kestrel::cli::RegisterInfo(app, exit_code);
  kestrel::cli::RegisterBench(app, exit_code);
  kestrel::cli::RegisterServe(app, exit_code);
  kestrel::cli::RegisterBenchServe(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "kestrel: error: %s (see kestrel --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    // Verbs return Status for bad input; anything reaching here is still reported in one line.
    std::fprintf(stderr, "kestrel: error: %s\n", e.what());
    return 1;
  }
  return exit_code;
}
