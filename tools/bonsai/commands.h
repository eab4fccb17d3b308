// One registration function per subcommand; each lives in cmd_<name>.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include <optional>

#include "bonsai/kv_type.h"

namespace bonsai::cli {

void add_inspect(CLI::App& app);
void add_synth(CLI::App& app);
void add_gate(CLI::App& app);
void add_bench(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_run(CLI::App& app);
void add_chat(CLI::App& app);

// --main-gpu (also -mg, renamed in main.cpp): the CUDA device index (SessionOptions::main_gpu),
// checked with check_main_gpu (bonsai/session.h) before a model loads.
void add_main_gpu_option(CLI::App* cmd, int& main_gpu);
// --cache-type-k / --cache-type-v (also -ctk / -ctv, renamed in main.cpp), llama.cpp's KV cache flags.
void add_cache_type_options(CLI::App* cmd, std::string& k, std::string& v);
// The one type both name (UsageError for an unknown name, or for a mixed pair: the kernels take one
// element type for K and V).
// -ctk / -ctv values to one type; "auto" (the default) on both: none, i.e. the backend's default
// (Backend::default_kv_type); "auto" on one side: the other side's type.
std::optional<KvType> parse_kv_types(const std::string& k, const std::string& v);

}  // namespace bonsai::cli
