// bonsai — the command-line front end. Each subcommand is registered from its
// own file (cmd_*.cpp); this file only wires them up and owns error reporting:
// a bonsai::Error is printed once as "error: ..." (exit 1; 2 for usage errors),
// never as a stack trace or an abort.
#include <cstdio>
#include <exception>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"bonsai — inference engine for ternary Bonsai 2 (qwen35) models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "bonsai 0.1.0");
  bonsai::cli::add_inspect(app);
  bonsai::cli::add_synth(app);
  bonsai::cli::add_gate(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const bonsai::UsageError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  } catch (const bonsai::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    fmt::print(stderr, "error: out of memory\n");
    return 1;
  }
  return 0;
}
