// bonsai — the command-line front end. Each subcommand is registered from its
// own file (cmd_*.cpp); this file only wires them up and owns error reporting:
// a bonsai::Error is printed once as "error: ..." (exit 1; 2 for usage errors),
// never as a stack trace or an abort.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/core.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "bonsai/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries command output (generated text, --ids JSON).
  spdlog::set_default_logger(spdlog::stderr_color_mt("bonsai"));
  CLI::App app{"bonsai — inference engine for ternary Bonsai 2 (qwen35) models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "bonsai 0.1.0");
  bonsai::cli::add_inspect(app);
  bonsai::cli::add_synth(app);
  bonsai::cli::add_gate(app);
  bonsai::cli::add_bench(app);
  bonsai::cli::add_tokenize(app);
  bonsai::cli::add_run(app);
  bonsai::cli::add_chat(app);
  try {
    // llama.cpp spells --system-prompt "-sys", --ubatch-size "-ub", the KV cache types "-ctk" /
    // "-ctv" and --main-gpu "-mg"; CLI11 has no multi-letter single-dash options, so they are renamed here.
    std::string sys_long = "--system-prompt", ub_long = "--ubatch-size", ctk_long = "--cache-type-k",
                ctv_long = "--cache-type-v", mg_long = "--main-gpu";
    std::vector<char*> args(argv, argv + argc);
    for (auto& a : args)
      if (std::string_view(a) == "-sys")
        a = sys_long.data();
      else if (std::string_view(a) == "-ub")
        a = ub_long.data();
      else if (std::string_view(a) == "-ctk")
        a = ctk_long.data();
      else if (std::string_view(a) == "-ctv")
        a = ctv_long.data();
      else if (std::string_view(a) == "-mg")
        a = mg_long.data();
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help / the parse error
    return rc == 0 ? 0 : 2;      // every command-line mistake is a usage error (exit 2)
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
