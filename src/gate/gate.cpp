#include "gate/gate.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "bonsai/error.h"
#include "bonsai/model.h"
#include "bonsai/session.h"

namespace bonsai {
namespace {

struct Case {
  std::string name, model, logits;
  int n_vocab = 0, n_prompt = 0;
  std::vector<int32_t> tokens;
};

std::vector<Case> read_manifest(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open parity manifest", path);
  nlohmann::json j;
  try {
    in >> j;
  } catch (const std::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  if (!j.is_object() || j.value("format", "") != "bonsai-parity/1")
    fail("{}: field 'format' must be \"bonsai-parity/1\"", path);
  if (!j.contains("cases") || !j["cases"].is_array()) fail("{}: field 'cases' must be an array", path);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::vector<Case> out;
  for (size_t i = 0; i < j["cases"].size(); ++i) {
    const auto& c = j["cases"][i];
    Case k;
    try {
      k.name = c.at("name").get<std::string>();
      k.model = (dir / c.at("model").get<std::string>()).string();
      k.logits = (dir / c.at("logits").get<std::string>()).string();
      k.n_vocab = c.at("n_vocab").get<int>();
      k.n_prompt = c.at("n_prompt").get<int>();
      k.tokens = c.at("tokens").get<std::vector<int32_t>>();
    } catch (const std::exception& e) {
      fail("{}: case #{}: {}", path, i, e.what());
    }
    if (k.n_vocab <= 0 || k.n_prompt <= 0 || k.n_prompt > static_cast<int>(k.tokens.size()))
      fail("{}: case '{}': n_vocab/n_prompt inconsistent with {} tokens", path, k.name, k.tokens.size());
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<float> read_logits(const Case& c) {
  const size_t n = c.tokens.size() * static_cast<size_t>(c.n_vocab);
  std::ifstream in(c.logits, std::ios::binary | std::ios::ate);
  if (!in) fail("{}: cannot open reference logits of case '{}'", c.logits, c.name);
  const auto size = static_cast<size_t>(in.tellg());
  if (size != n * sizeof(float))
    fail("{}: {} bytes, expected {} ({} tokens x {} vocab x 4) for case '{}'", c.logits, size, n * 4,
         c.tokens.size(), c.n_vocab, c.name);
  std::vector<float> v(n);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(size));
  return v;
}

int argmax(const float* x, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;  // lowest id wins ties
  return best;
}

double margin(const float* x, int n) {
  int a = argmax(x, n);
  double second = -INFINITY;
  for (int i = 0; i < n; ++i)
    if (i != a) second = std::max(second, static_cast<double>(x[i]));
  return x[a] - second;
}

bool selected(const GateOptions& o, const std::string& name) {
  if (o.cases.empty()) return true;
  for (const auto& s : o.cases)
    if (name == s || name.find(s) != std::string::npos) return true;
  return false;
}

GateCaseResult run_case(const GateOptions& o, const Case& c, const Model& model) {
  GateCaseResult r;
  r.name = c.name;
  r.model = c.model;
  if (static_cast<int>(model.config().n_vocab) != c.n_vocab)
    fail("case '{}': manifest n_vocab {} but model {} has {}", c.name, c.n_vocab, c.model,
         model.config().n_vocab);
  const std::vector<float> ref = read_logits(c);
  const int V = c.n_vocab, T = static_cast<int>(c.tokens.size());
  auto t0 = std::chrono::steady_clock::now();

  SessionOptions so;
  so.path = o.path;
  so.n_threads = o.n_threads;
  so.main_gpu = o.main_gpu;
  so.kv_type = o.kv_type;
  so.n_ctx = std::max(T + 1, 16);
  if (!o.dump_activations_dir.empty()) {
    std::string n = c.name;
    for (char& ch : n)
      if (ch == '/') ch = '_';
    so.dump_dir = o.dump_activations_dir + "/" + n;
  }
  // Teacher-forced pass over every token.
  std::vector<float> got(static_cast<size_t>(T) * V);
  {
    Session s(model, so);
    r.kv_type = s.kv_type();
    int start = 0;
    if (o.prefill) {
      // Prompt positions come from the batched prefill, the rest from decode.
      s.prefill(std::span<const int32_t>(c.tokens.data(), c.n_prompt),
                std::span<float>(got.data(), static_cast<size_t>(c.n_prompt) * V));
      start = c.n_prompt;
      // The same build's token walk over the prompt, for the prefill-vs-walk difference.
      SessionOptions plain = so;
      plain.dump_dir.clear();
      Session walk(model, plain);
      r.prefill_vs_walk = 0;
      for (int i = 0; i < c.n_prompt; ++i) {
        auto l = walk.decode(c.tokens[i]);
        for (int v = 0; v < V; ++v)
          r.prefill_vs_walk = std::max(
              r.prefill_vs_walk, std::fabs(static_cast<double>(l[v]) - got[static_cast<size_t>(i) * V + v]));
      }
    }
    for (int i = start; i < T; ++i) {
      auto l = s.decode(c.tokens[i]);
      std::copy(l.begin(), l.end(), got.begin() + static_cast<size_t>(i) * V);
    }
  }
  r.positions = T;
  r.min_margin = INFINITY;
  for (int i = 0; i < T; ++i) {
    const float* a = got.data() + static_cast<size_t>(i) * V;
    const float* b = ref.data() + static_cast<size_t>(i) * V;
    double dot = 0, na = 0, nb = 0;
    for (int v = 0; v < V; ++v) {
      r.max_abs_diff = std::max(r.max_abs_diff, std::fabs(static_cast<double>(a[v]) - b[v]));
      r.max_abs_ref = std::max(r.max_abs_ref, std::fabs(static_cast<double>(b[v])));
      dot += static_cast<double>(a[v]) * b[v];
      na += static_cast<double>(a[v]) * a[v];
      nb += static_cast<double>(b[v]) * b[v];
    }
    r.min_cosine = std::min(r.min_cosine, dot / std::sqrt(na * nb + 1e-300));
    const double m = margin(b, V);
    r.min_margin = std::min(r.min_margin, m);
    if (m < 0.05) ++r.low_margin_rows;
    if (argmax(a, V) == argmax(b, V))
      ++r.argmax_agree;
    else if (m >= 0.1)
      ++r.argmax_disagree_high_margin;
  }
  if (!o.dump_logits_dir.empty()) {
    std::filesystem::create_directories(o.dump_logits_dir);
    std::string n = c.name;
    for (char& ch : n)
      if (ch == '/') ch = '_';
    std::string file = o.dump_logits_dir + "/" + n + ".logits.f32";
    std::ofstream out(file, std::ios::binary);
    if (!out) fail("{}: cannot write logits dump", file);
    out.write(reinterpret_cast<const char*>(got.data()),
              static_cast<std::streamsize>(got.size() * sizeof(float)));
  }

  // Greedy free run from the prompt.
  r.continuation_len = T - c.n_prompt;
  r.continuation_required = r.continuation_len;
  if (o.criteria == GateCriteria::Fast) {
    // Only steps before the first reference margin < 0.1 must match.
    r.continuation_required = 0;
    for (int i = c.n_prompt - 1; i < T - 1; ++i) {
      if (margin(ref.data() + static_cast<size_t>(i) * V, V) < 0.1) break;
      ++r.continuation_required;
    }
  }
  {
    SessionOptions plain = so;
    plain.dump_dir.clear();
    Session s(model, plain);
    std::span<const float> l;
    if (o.prefill)
      l = s.prefill(std::span<const int32_t>(c.tokens.data(), c.n_prompt));
    else
      for (int i = 0; i < c.n_prompt; ++i) l = s.decode(c.tokens[i]);
    for (int i = c.n_prompt; i < T; ++i) {
      int next = argmax(l.data(), V);
      if (next != c.tokens[i]) break;
      ++r.continuation_match;
      if (i + 1 < T) l = s.decode(next);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const double tol = 2e-4 * std::max(1.0, r.max_abs_ref);
  if (o.criteria == GateCriteria::Strict) {
    if (r.argmax_agree != T)
      r.why = fmt::format("argmax differs at {} of {} positions", T - r.argmax_agree, T);
    else if (r.max_abs_diff > tol)
      r.why = fmt::format("max|dlogit| {:.3e} > {:.3e}", r.max_abs_diff, tol);
    else if (r.continuation_match != r.continuation_len)
      r.why = fmt::format("greedy continuation diverges at step {}", r.continuation_match);
  } else {
    if (r.min_cosine < 0.999)
      r.why = fmt::format("min cosine {:.6f} < 0.999", r.min_cosine);
    else if (r.argmax_disagree_high_margin > 0)
      r.why = fmt::format("argmax differs at {} positions with reference margin >= 0.1",
                          r.argmax_disagree_high_margin);
    else if (r.continuation_match < r.continuation_required)
      r.why = fmt::format("greedy continuation diverges at step {} (must match {})", r.continuation_match,
                          r.continuation_required);
  }
  r.pass = r.why.empty();
  return r;
}

}  // namespace

std::vector<GateCaseResult> run_gate(const GateOptions& o) {
  std::vector<Case> cases = read_manifest(o.manifest);
  std::map<std::string, std::unique_ptr<Model>> models;
  std::vector<GateCaseResult> out;
  for (const Case& c : cases) {
    if (!selected(o, c.name)) continue;
    if (o.on_case_start) o.on_case_start(c.name);
    auto& m = models[c.model];
    if (!m) m = Model::load(c.model);
    out.push_back(run_case(o, c, *m));
  }
  if (out.empty()) usage_fail("{}: no case matches the selection", o.manifest);
  return out;
}

}  // namespace bonsai
