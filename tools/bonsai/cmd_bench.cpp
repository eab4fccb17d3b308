// bonsai bench — llama-bench-shaped throughput measurement.
//   bonsai bench -m M.gguf [-p 512] [-n 128] [-d 0,4096] [-r 5] [-t 1,2] [-ub 256,512] [--path fast]
//                [-ctk f32,f16] [-o md|json|csv]
// Each (model, path, threads, depth, test) runs r repetitions after one warm-up; t/s is
// mean ± sample std. At a depth d > 0 every repetition first fills d context positions with an
// untimed prefill of random tokens (llama-bench's -d), so a test measures its steps after them. Decode rows
// also give the weight bytes streamed per second (bytes read per token × t/s) and that as a fraction of this
// machine's read bandwidth, measured in the same run.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bonsai/error.h"
#include "bonsai/model.h"
#include "bonsai/session.h"
#include "commands.h"
#include "runtime/bandwidth.h"
#include "runtime/thread_pool.h"

namespace bonsai::cli {
namespace {

struct BenchCli {
  std::vector<std::string> models;
  std::vector<int> n_prompt{512};
  std::vector<int> n_gen{128};
  std::vector<int> n_depth{0};  // context positions filled (untimed) before each test
  int reps = 5;
  std::vector<int> threads;
  std::vector<int> ubatch{0};  // prompt tokens per batched forward step; 0 = the backend's choice
  std::vector<std::string> paths{"auto"};
  int main_gpu = 0;                                   // -mg: CUDA device of the cuda and auto paths
  std::vector<std::string> cache_k{"auto"}, cache_v;  // -ctk / -ctv; -ctv defaults to -ctk's list
  std::string output = "md";
  bool no_bandwidth = false;
  bool profile = false;
  bool full_logits = false;  // tg steps copy the whole logits row to the host
};

struct Breakdown {
  std::string title;
  int tokens = 0;
  std::vector<OpProfile> ops;
};

struct Row {
  std::string model, path, test;
  uint64_t size = 0, params = 0;
  int threads = 0;
  int ubatch = 0;                      // the session's prefill chunk (pp tests)
  KvType kv = KvType::F32;             // KV cache element type
  int depth = 0;                       // context positions filled before the test
  double mean = 0, std = 0;            // tokens per second
  double weight_gbs = 0, bw_frac = 0;  // decode only
};

// Bytes of weights one decode step reads: every tensor except the embedding
// table, of which only one row is gathered (unless it is also the tied head).
uint64_t bytes_per_token(const Model& m) {
  uint64_t b = 0;
  const bool tied = m.config().tied_output;
  for (const auto& t : m.file().tensors()) {
    if (t.name == "token_embd.weight" && !tied)
      b += t.nbytes / std::max<uint64_t>(1, t.dim(1));
    else
      b += t.nbytes;
  }
  return b;
}

// A bound for -d only (the session refuses a context past the model's trained one with its own message).
constexpr int kMaxDepth = 1 << 20;

std::string human_size(uint64_t b) { return fmt::format("{:.2f} GiB", b / 1073741824.0); }
std::string human_params(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.2f} B", n / 1e9);
  return fmt::format("{:.2f} M", n / 1e6);
}

void run(const BenchCli& o) {
  if (o.reps < 1) usage_fail("-r/--repetitions must be >= 1 (got {})", o.reps);
  for (const auto& p : o.paths) {
    check_backend_name(p);
    check_main_gpu(p, o.main_gpu);
  }
  for (int p : o.n_prompt)
    if (p < 0) usage_fail("-p/--n-prompt values must be >= 0 (got {})", p);
  for (int n : o.n_gen)
    if (n < 0) usage_fail("-n/--n-gen values must be >= 0 (got {})", n);
  if (o.n_depth.empty()) usage_fail("-d/--n-depth needs at least one value");
  for (int d : o.n_depth)
    if (d < 0 || d > kMaxDepth) usage_fail("-d/--n-depth values must be in [0, {}] (got {})", kMaxDepth, d);
  std::vector<int> threads = o.threads.empty() ? std::vector<int>{default_thread_count()} : o.threads;
  for (int t : threads)
    if (t < 1 || t > 1024) usage_fail("-t/--threads values must be in [1, 1024] (got {})", t);
  if (o.ubatch.empty()) usage_fail("-ub/--ubatch-size needs at least one value");
  for (int u : o.ubatch)
    if (u < 0 || u > 4096)
      usage_fail("-ub/--ubatch-size values must be in [1, 4096], or 0 for the backend's choice (got {})", u);
  // The n_ubatch column only when asked for (as llama-bench shows non-default parameters).
  const bool show_ub = o.ubatch.size() > 1 || o.ubatch[0] != 0;
  const std::vector<std::string>& cache_v = o.cache_v.empty() ? o.cache_k : o.cache_v;
  if (o.cache_k.empty() || cache_v.size() != o.cache_k.size())
    usage_fail("-ctk/--cache-type-k and -ctv/--cache-type-v need lists of the same length (got {} and {})",
               o.cache_k.size(), cache_v.size());
  std::vector<std::optional<KvType>> kv_types;
  for (size_t i = 0; i < o.cache_k.size(); ++i) kv_types.push_back(parse_kv_types(o.cache_k[i], cache_v[i]));
  // type_k / type_v columns only when a type other than f32 is measured (the table's; the stderr
  // progress lines name an f16 cache as soon as its session exists)
  bool show_kv = false;
  if (o.output != "md" && o.output != "json" && o.output != "csv")
    usage_fail("-o/--output must be md, json or csv (got '{}')", o.output);

  double bw = 0;
  if (!o.no_bandwidth) {
    ThreadPool pool(default_thread_count());
    fmt::print(stderr, "measuring read bandwidth ({} threads, 1 GiB) ...\n", pool.size());
    bw = measure_read_bandwidth(pool);
    fmt::print(stderr, "read bandwidth: {:.2f} GB/s\n", bw / 1e9);
  }
  std::vector<Row> rows;
  std::vector<Breakdown> breakdowns;
  for (const auto& path : o.models) {
    fmt::print(stderr, "loading {} ...\n", path);
    auto model = Model::load(path);
    const ModelConfig& c = model->config();
    const uint64_t bpt = bytes_per_token(*model);
    std::mt19937 rng(1234), depth_rng(4321);  // the tests' tokens are the same with or without -d
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(c.n_vocab) - 1);
    const int max_depth = *std::max_element(o.n_depth.begin(), o.n_depth.end());
    std::vector<int32_t> depth_toks(static_cast<size_t>(max_depth));
    for (auto& x : depth_toks) x = tok(depth_rng);
    for (const auto& p : o.paths)
      for (int nt : threads)
        for (const std::optional<KvType>& kv : kv_types)
          for (size_t ui = 0; ui < o.ubatch.size(); ++ui) {
            // Every -ub value runs the pp tests; the tg tests (one token per step) only with the first.
            struct Test {
              std::string name;
              int n;
              bool prompt;
            };
            std::vector<Test> tests;
            for (int n : o.n_prompt)
              if (n > 0) tests.push_back({fmt::format("pp{}", n), n, true});
            for (int n : o.n_gen)
              if (n > 0 && ui == 0) tests.push_back({fmt::format("tg{}", n), n, false});
            int max_n = 1;
            for (const auto& t : tests) max_n = std::max(max_n, t.n);
            SessionOptions so;
            so.path = p;
            so.n_threads = nt;
            so.main_gpu = o.main_gpu;
            // Room for the deepest context and the longest test (+ 1 spare position, as before -d existed,
            // unless that one would pass the model's trained context).
            const int64_t need = static_cast<int64_t>(max_depth) + max_n;
            if (c.n_ctx_train > 0 && need > static_cast<int64_t>(c.n_ctx_train))
              usage_fail(
                  "-d/--n-depth {} + the longest test ({} tokens) exceed the model's trained context ({})",
                  max_depth, max_n, c.n_ctx_train);
            so.n_ctx =
                static_cast<int>(c.n_ctx_train > 0 ? std::min<int64_t>(need + 1, c.n_ctx_train) : need + 1);
            so.prefill_chunk = o.ubatch[ui];
            so.kv_type = kv;
            Session s(*model, so);
            show_kv = show_kv || s.kv_type() != KvType::F32;
            // The context before a test: d positions of depth_toks, prefilled (untimed).
            auto fill = [&](Session& ss, int d) {
              ss.reset();
              if (d > 0) ss.prefill(std::span<const int32_t>(depth_toks.data(), static_cast<size_t>(d)));
            };
            for (int d : o.n_depth)
              for (const auto& t : tests) {
                std::vector<int32_t> toks(static_cast<size_t>(t.n));
                for (auto& x : toks) x = tok(rng);
                const std::string label = d > 0 ? fmt::format("{} @ d{}", t.name, d) : t.name;
                auto once = [&] {
                  fill(s, d);
                  auto t0 = std::chrono::steady_clock::now();
                  if (t.prompt)
                    s.prefill(toks);
                  else if (o.full_logits)
                    for (int32_t x : toks) s.decode(x);
                  else  // each step as greedy decoding runs it: only the argmax crosses to the host
                    for (int32_t x : toks) s.decode_top_k(x, 1);
                  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                };
                fmt::print(
                    stderr, "{} | {} | {} threads{} | {}: warm-up", model->path(), p, nt,
                    s.kv_type() != KvType::F32 ? fmt::format(" | cache {}", kv_type_name(s.kv_type())) : "",
                    label);
                std::fflush(stderr);
                once();
                std::vector<double> tps;
                for (int r = 0; r < o.reps; ++r) {
                  tps.push_back(t.n / once());
                  fmt::print(stderr, " {:.2f}", tps.back());
                  std::fflush(stderr);
                }
                fmt::print(stderr, " t/s\n");
                Row row{model->path(),         s.backend_name(),  t.name,
                        model->weight_bytes(), model->n_params(), nt};
                if (t.prompt) row.ubatch = s.prefill_chunk();
                row.kv = s.kv_type();
                row.depth = d;
                for (double v : tps) row.mean += v / tps.size();
                for (double v : tps) row.std += (v - row.mean) * (v - row.mean);
                row.std = tps.size() > 1 ? std::sqrt(row.std / (tps.size() - 1)) : 0;
                if (!t.prompt) {
                  row.weight_gbs = row.mean * static_cast<double>(bpt) / 1e9;
                  row.bw_frac = bw > 0 ? row.weight_gbs * 1e9 / bw : 0;
                }
                rows.push_back(row);
                if (o.profile && !t.prompt) {
                  // A separate, profiled run: per-op syncs and timers must not disturb the t/s above.
                  SessionOptions po = so;
                  po.profile = true;
                  Session ps(*model, po);
                  fill(ps, d);
                  ps.clear_profile();  // the steps only, not the context's prefill
                  for (int32_t x : toks)
                    if (o.full_logits)
                      ps.decode(x);
                    else
                      ps.decode_top_k(x, 1);
                  breakdowns.push_back({fmt::format("{} | {} | {} threads | {}", model->path(), p, nt, label),
                                        t.n, ps.profile()});
                }
              }
          }
  }

  if (o.output == "json") {
    nlohmann::json j;
    j["read_bandwidth_gbs"] = bw / 1e9;
    for (const auto& r : rows)
      j["results"].push_back({{"model", r.model},
                              {"size", r.size},
                              {"params", r.params},
                              {"backend", r.path},
                              {"threads", r.threads},
                              {"main_gpu", o.main_gpu},
                              {"n_ubatch", r.ubatch},
                              {"type_k", kv_type_name(r.kv)},
                              {"type_v", kv_type_name(r.kv)},
                              {"test", r.test},
                              {"n_depth", r.depth},
                              {"t/s", r.mean},
                              {"t/s_std", r.std},
                              {"weight_gbs", r.weight_gbs},
                              {"bandwidth_fraction", r.bw_frac}});
    fmt::print("{}\n", j.dump(1));
    return;
  }
  if (o.output == "csv") {
    // type_k / type_v, then main_gpu, last: the columns before them keep the places they had before
    fmt::print(
        "model,size,params,backend,threads,n_ubatch,test,n_depth,ts_mean,ts_std,weight_gbs,bandwidth_"
        "fraction,type_k,type_v,main_gpu\n");
    for (const auto& r : rows)
      fmt::print("{},{},{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{},{},{}\n", r.model, r.size, r.params,
                 r.path, r.threads, r.ubatch, r.test, r.depth, r.mean, r.std, r.weight_gbs, r.bw_frac,
                 kv_type_name(r.kv), kv_type_name(r.kv), o.main_gpu);
    return;
  }
  if (bw > 0) fmt::print("read bandwidth (measured in this run): {:.2f} GB/s\n\n", bw / 1e9);
  fmt::print("| model | size | params | backend | threads |{}{} test | t/s | weight GB/s | of read BW |\n",
             show_ub ? " n_ubatch |" : "", show_kv ? " type_k | type_v |" : "");
  fmt::print("| --- | ---: | ---: | --- | ---: |{}{} ---: | ---: | ---: | ---: |\n", show_ub ? " ---: |" : "",
             show_kv ? " --- | --- |" : "");
  for (const auto& r : rows) {
    std::string gbs = r.weight_gbs > 0 ? fmt::format("{:.2f}", r.weight_gbs) : "";
    std::string frac = r.bw_frac > 0 ? fmt::format("{:.2f}", r.bw_frac) : "";
    std::string ub = !show_ub ? "" : r.ubatch > 0 ? fmt::format(" {} |", r.ubatch) : " |";
    if (show_kv) ub += fmt::format(" {} | {} |", kv_type_name(r.kv), kv_type_name(r.kv));
    const std::string test =
        r.depth > 0 ? fmt::format("{} @ d{}", r.test, r.depth) : r.test;  // llama-bench's
    fmt::print("| {} | {} | {} | {} | {} |{} {} | {:.2f} ± {:.2f} | {} | {} |\n", r.model, human_size(r.size),
               human_params(r.params), r.path, r.threads, ub, test, r.mean, r.std, gbs, frac);
  }
  for (auto& b : breakdowns) {
    std::sort(b.ops.begin(), b.ops.end(),
              [](const OpProfile& x, const OpProfile& y) { return x.seconds > y.seconds; });
    double total = 0;
    for (const auto& op : b.ops) total += op.seconds;
    fmt::print("\nper-op time of one decode step ({}; profiled run, synced per op)\n\n", b.title);
    fmt::print(
        "| op | calls/token | ms/token | share | weight GB/s |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (const auto& op : b.ops) {
      std::string gbs = op.weight_bytes ? fmt::format("{:.2f}", op.weight_bytes / op.seconds / 1e9) : "";
      fmt::print("| {} | {:.0f} | {:.3f} | {:.1f} % | {} |\n", op.op, double(op.calls) / b.tokens,
                 op.seconds * 1e3 / b.tokens, 100.0 * op.seconds / total, gbs);
    }
    fmt::print("| total | | {:.3f} | 100 % | |\n", total * 1e3 / b.tokens);
  }
}

}  // namespace

void add_bench(CLI::App& app) {
  auto o = std::make_shared<BenchCli>();
  auto* cmd =
      app.add_subcommand("bench", "Measure prompt (ppN) and decode (tgN) throughput, llama-bench style");
  cmd->add_option("-m,--model", o->models, "Model file(s); comma-separated or repeated")
      ->required()
      ->delimiter(',');
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt lengths (pp tests; 0 = none)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", o->n_gen, "Generated lengths (tg tests, greedy decode steps; 0 = none)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-d,--n-depth", o->n_depth,
                  "Context positions filled before each test by an untimed prefill of random tokens "
                  "(tests then measure their steps after them)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", o->reps, "Repetitions per test")->capture_default_str();
  cmd->add_option("-t,--threads", o->threads, "Thread counts (default: physical cores)")->delimiter(',');
  cmd->add_option(
         "--ubatch-size", o->ubatch,
         "Prompt tokens per batched forward step, also -ub; comma-separated (0: the backend's choice)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--path,--backend", o->paths, "Compute paths: auto, fast/cpu, fast-int8, cuda, ref")
      ->delimiter(',')
      ->capture_default_str();
  add_main_gpu_option(cmd, o->main_gpu);
  cmd->add_option(
         "--cache-type-k", o->cache_k,
         "KV cache types, also -ctk; comma-separated: auto (f16 on cuda, f32 on ref and the CPU paths), "
         "f32, f16")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option(
         "--cache-type-v", o->cache_v,
         "KV cache types for V, also -ctv; comma-separated, pairwise equal to -ctk (default: -ctk's)")
      ->delimiter(',');
  cmd->add_option("-o,--output", o->output, "Output format: md, json, csv")->capture_default_str();
  cmd->add_flag("--no-bandwidth", o->no_bandwidth, "Skip the read-bandwidth measurement");
  cmd->add_flag(
      "--full-logits", o->full_logits,
      "tg steps bring the whole logits row to the host (default: only the argmax, as greedy decoding)");
  cmd->add_flag("--profile", o->profile,
                "After each tg test, print a per-op time breakdown (separate profiled run)");
  cmd->callback([o] { run(*o); });
}

}  // namespace bonsai::cli
