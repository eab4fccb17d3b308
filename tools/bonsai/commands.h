// One registration function per subcommand; each lives in cmd_<name>.cpp.
#pragma once

#include <CLI/CLI.hpp>

namespace bonsai::cli {

void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_gate(CLI::App& app);
void add_bench(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_run(CLI::App& app);
void add_chat(CLI::App& app);

}  // namespace bonsai::cli
