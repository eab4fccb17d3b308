// bonsai gate MANIFEST — token parity against reference logits (bonsai-parity/1).
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bonsai/error.h"
#include "bonsai/session.h"
#include "commands.h"
#include "gate/gate.h"

namespace bonsai::cli {
namespace {

struct GateCli {
  GateOptions o;
  std::string criteria = "auto";
  std::string cache_type_k = "auto", cache_type_v = "auto";
  bool json = false;
};

void run(GateCli& g) {
  GateOptions& o = g.o;
  check_backend_name(o.path);
  check_main_gpu(o.path, o.main_gpu);
  o.kv_type = parse_kv_types(g.cache_type_k, g.cache_type_v);
  // An f16 cache rounds every K/V element: a fast path's criteria even on the reference's arithmetic.
  if (g.criteria == "auto")
    // (the reference backend's own default cache type is f32)
    o.criteria = o.path == "ref" && o.kv_type.value_or(KvType::F32) == KvType::F32 ? GateCriteria::Strict
                                                                                   : GateCriteria::Fast;
  else if (g.criteria == "strict")
    o.criteria = GateCriteria::Strict;
  else if (g.criteria == "fast")
    o.criteria = GateCriteria::Fast;
  else
    usage_fail("--criteria must be auto, strict or fast (got '{}')", g.criteria);
  if (!g.json) o.on_case_start = [](const std::string& n) { fmt::print(stderr, "running {} ...\n", n); };
  auto results = run_gate(o);
  bool all = true;
  for (const auto& r : results) all = all && r.pass;
  // The cache type the cases ran with (every session of a run resolves the same one).
  const KvType kv = results.empty() ? o.kv_type.value_or(KvType::F32) : results[0].kv_type;
  if (g.json) {
    nlohmann::json j;
    j["manifest"] = o.manifest;
    j["path"] = o.path;
    j["criteria"] = o.criteria == GateCriteria::Strict ? "strict" : "fast";
    j["prefill"] = o.prefill;
    j["cache_type"] = kv_type_name(kv);
    j["pass"] = all;
    for (const auto& r : results)
      j["cases"].push_back({{"name", r.name},
                            {"model", r.model},
                            {"positions", r.positions},
                            {"argmax_agree", r.argmax_agree},
                            {"low_margin_rows", r.low_margin_rows},
                            {"argmax_disagree_margin_ge_0_1", r.argmax_disagree_high_margin},
                            {"max_abs_diff", r.max_abs_diff},
                            {"max_abs_ref", r.max_abs_ref},
                            {"min_cosine", r.min_cosine},
                            {"min_ref_margin", r.min_margin},
                            {"continuation_len", r.continuation_len},
                            {"continuation_match", r.continuation_match},
                            {"continuation_required", r.continuation_required},
                            {"seconds", r.seconds},
                            {"prefill_vs_walk_max_abs_diff", r.prefill_vs_walk},
                            {"pass", r.pass},
                            {"why", r.why}});
    fmt::print("{}\n", j.dump(1));
  } else {
    fmt::print("gate: {} | path {} | criteria {}{}{}\n\n", o.manifest, o.path,
               o.criteria == GateCriteria::Strict ? "strict" : "fast", o.prefill ? " | prefill" : "",
               kv == KvType::F32 ? "" : fmt::format(" | cache {}", kv_type_name(kv)));
    fmt::print("{:<26} {:>5} {:>9} {:>8} {:>10} {:>10} {:>9} {:>7} {:>6}  {}\n", "case", "pos", "argmax",
               "m<0.05", "max|d|", "tol", "min cos", "cont", "sec", "result");
    for (const auto& r : results) {
      const double tol = 2e-4 * std::max(1.0, r.max_abs_ref);
      fmt::print("{:<26} {:>5} {:>4}/{:<4} {:>8} {:>10.3e} {:>10.3e} {:>9.6f} {:>3}/{:<3} {:>6.2f}  {}\n",
                 r.name, r.positions, r.argmax_agree, r.positions, r.low_margin_rows, r.max_abs_diff, tol,
                 r.min_cosine, r.continuation_match, r.continuation_len, r.seconds,
                 r.pass ? "PASS" : "FAIL: " + r.why);
    }
    if (o.prefill)
      for (const auto& r : results)
        fmt::print("{:<26} prefill vs token walk (same build): max|dlogit| {:.3e}\n", r.name,
                   r.prefill_vs_walk);
    size_t n_pass = 0;
    for (const auto& r : results) n_pass += r.pass;
    fmt::print("\n{} of {} cases passed\n", n_pass, results.size());
  }
  if (!all) throw Error(fmt::format("gate failed ({} path)", o.path));
}

}  // namespace

void add_gate(CLI::App& app) {
  auto g = std::make_shared<GateCli>();
  auto* cmd = app.add_subcommand("gate", "Token parity against reference logits (bonsai-parity/1 manifest)");
  cmd->add_option("manifest", g->o.manifest, "Parity manifest (e.g. ../shared/fixtures/manifest.json)")
      ->required();
  cmd->add_option("--case", g->o.cases, "Only cases whose name equals or contains this (repeatable)");
  cmd->add_option(
         "--path,--backend", g->o.path,
         "Compute path: ref (scalar reference), fast/cpu (CPU kernels, faithful), fast-int8, cuda, auto")
      ->capture_default_str();
  add_main_gpu_option(cmd, g->o.main_gpu);
  add_cache_type_options(cmd, g->cache_type_k, g->cache_type_v);
  cmd->add_option("--criteria", g->criteria,
                  "auto (strict for ref with an f32 cache, fast otherwise), strict or fast")
      ->capture_default_str();
  cmd->add_option("-t,--threads", g->o.n_threads, "Threads (0 = physical cores)")->check(CLI::Range(0, 1024));
  cmd->add_flag("--prefill", g->o.prefill, "Feed the prompt through Session::prefill");
  cmd->add_option("--dump-logits", g->o.dump_logits_dir,
                  "Write teacher-forced logits per case (<case>.logits.f32)");
  cmd->add_option("--dump-activations", g->o.dump_activations_dir,
                  "Write every named activation per case and position (<dir>/<case>/pos<P>/<name>.f32)");
  cmd->add_flag("--json", g->json, "Print results as JSON");
  cmd->callback([g] { run(*g); });
}

}  // namespace bonsai::cli
