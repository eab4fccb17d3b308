// bonsai inspect FILE — metadata, tensor table, per-type totals and format quirks.
#include <map>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "commands.h"
#include "inspect_checks.h"

namespace bonsai::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool no_tensors = false;
  bool full_arrays = false;
};

std::string human_bytes(uint64_t b) {
  if (b >= 1000000000ull) return fmt::format("{:.3f} GB", b / 1e9);
  if (b >= 1000000ull) return fmt::format("{:.3f} MB", b / 1e6);
  if (b >= 1000ull) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{} B", b);
}

void run_inspect(const InspectOptions& o) {
  GgufFile f = GgufFile::open(o.path);
  fmt::print("file: {}\n", o.path);
  fmt::print("GGUF v{}, {} bytes, alignment {}, {} metadata keys, {} tensors, data at offset {}\n\n",
             f.version(), f.file_size(), f.alignment(), f.metadata().size(), f.tensors().size(),
             f.data_offset());
  fmt::print("metadata:\n");
  size_t w = 0;
  for (const auto& [k, v] : f.metadata()) w = std::max(w, k.size());
  for (const auto& [k, v] : f.metadata())
    fmt::print("  {:<{}} = {}\n", k, w, v.summary(o.full_arrays ? SIZE_MAX : 6));

  struct Total {
    uint64_t count = 0, elements = 0, bytes = 0;
  };
  std::map<std::string, Total> totals;
  uint64_t all_bytes = 0, all_elems = 0;
  if (!f.tensors().empty() && !o.no_tensors) {
    fmt::print("\ntensors:\n");
    size_t nw = 4;
    for (const auto& t : f.tensors()) nw = std::max(nw, t.name.size());
    fmt::print("  {:<{}}  {:<11} {:<18} {:>14}\n", "name", nw, "type", "shape (ne)", "bytes");
    for (const auto& t : f.tensors()) {
      const char* tn = t.dtype == DType::Other ? type_info(t.ggml_type)->name : dtype_info(t.dtype).name;
      fmt::print("  {:<{}}  {:<11} {:<18} {:>14}\n", t.name, nw, tn, t.shape_str(), t.nbytes);
    }
  }
  for (const auto& t : f.tensors()) {
    const char* tn = t.dtype == DType::Other ? type_info(t.ggml_type)->name : dtype_info(t.dtype).name;
    auto& tot = totals[tn];
    tot.count++;
    tot.elements += t.nelements;
    tot.bytes += t.nbytes;
    all_bytes += t.nbytes;
    all_elems += t.nelements;
  }
  if (!totals.empty()) {
    fmt::print("\ntotals by type:\n");
    fmt::print("  {:<11} {:>8} {:>16} {:>16} {:>12} {:>8}\n", "type", "tensors", "elements", "bytes", "",
               "bpw");
    for (const auto& [name, t] : totals)
      fmt::print("  {:<11} {:>8} {:>16} {:>16} {:>12} {:>8.4f}\n", name, t.count, t.elements, t.bytes,
                 human_bytes(t.bytes), t.elements ? 8.0 * t.bytes / t.elements : 0.0);
    fmt::print("  {:<11} {:>8} {:>16} {:>16} {:>12} {:>8.4f}\n", "all", f.tensors().size(), all_elems,
               all_bytes, human_bytes(all_bytes), all_elems ? 8.0 * all_bytes / all_elems : 0.0);
  }
  fmt::print("\nchecks:\n");
  for (const auto& line : inspect_checks(f)) fmt::print("  {}\n", line);
}

}  // namespace

void add_inspect(CLI::App& app) {
  auto opts = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect",
                                 "Show a GGUF file's metadata, tensors, per-type totals and format checks");
  cmd->add_option("file", opts->path, "GGUF file")->required();
  cmd->add_flag("--no-tensors", opts->no_tensors, "Omit the per-tensor table");
  cmd->add_flag("--full-arrays", opts->full_arrays, "Print arrays in full instead of summarised");
  cmd->callback([opts] { run_inspect(*opts); });
}

}  // namespace bonsai::cli
