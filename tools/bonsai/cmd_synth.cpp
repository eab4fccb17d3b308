// bonsai synth — write a synthetic Bonsai-2-format model (and optionally its
// unrotated F32 twin). Every bad value is a usage error naming the flag and
// the valid range; the library re-validates as a backstop.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "bonsai/error.h"
#include "bonsai/synth.h"
#include "commands.h"

namespace bonsai::cli {
namespace {

struct SynthCliOptions {
  std::string preset = "tiny";
  std::string output;
  uint64_t seed = 0;
  std::string type = "pq2_0";
  std::string ab_type;  // empty: the preset's
  std::optional<int64_t> block;
  bool tied = false;
  std::optional<int64_t> hadamard_version;
  bool no_vocab = false;
  bool quiet = false;
  std::string twin;
  std::string name;
  // per-dimension overrides
  std::optional<int64_t> layers, embd, ff, vocab, heads, kv_heads, head_dim, rot, ssm_state, ssm_inner,
      ssm_v_heads, ssm_k_heads, attn_interval, ctx;
};

constexpr int64_t kMaxDim = 1 << 20;

uint32_t in_range(const std::optional<int64_t>& v, const char* flag, int64_t lo, int64_t hi,
                  uint32_t fallback) {
  if (!v) return fallback;
  if (*v < lo || *v > hi) usage_fail("{} {}: must be in [{}, {}]", flag, *v, lo, hi);
  return static_cast<uint32_t>(*v);
}

DType parse_weight_type(const std::string& s) {
  if (s == "pq2_0") return DType::PQ2_0;
  if (s == "ptq1_0") return DType::PTQ1_0;
  if (s == "q2_0-g128") return DType::Q2_0_G128;
  if (s == "q2_0-g64") return DType::Q2_0_G64;
  usage_fail("--type {}: must be one of pq2_0, ptq1_0, q2_0-g128, q2_0-g64", s);
}

DType parse_ab_type(const std::string& s) {
  if (s == "bf16") return DType::BF16;
  if (s == "f16") return DType::F16;
  if (s == "f32") return DType::F32;
  usage_fail("--ab-type {}: must be one of bf16, f16, f32", s);
}

// Preset + overrides -> options, checking every flag by name.
SynthOptions build_options(const SynthCliOptions& a) {
  bool known = false;
  for (const auto& p : synth_preset_names()) known |= p == a.preset;
  if (!known) usage_fail("--preset {}: must be one of tiny, small, 27b", a.preset);
  SynthOptions o = synth_preset(a.preset);
  ModelConfig& c = o.config;
  c.n_layer = in_range(a.layers, "--layers", 1, 1024, c.n_layer);
  c.n_embd = in_range(a.embd, "--embd", 128, kMaxDim, c.n_embd);
  c.n_ff = in_range(a.ff, "--ff", 128, kMaxDim, c.n_ff);
  c.n_vocab = in_range(a.vocab, "--vocab", a.no_vocab ? 1 : kSynthMinVocab, 1 << 24, c.n_vocab);
  c.n_head = in_range(a.heads, "--heads", 1, 1024, c.n_head);
  c.n_head_kv = in_range(a.kv_heads, "--kv-heads", 1, 1024, c.n_head_kv);
  c.head_dim_k = c.head_dim_v = in_range(a.head_dim, "--head-dim", 2, 4096, c.head_dim_k);
  c.n_rot = in_range(a.rot, "--rot", 2, 4096, c.n_rot);
  c.ssm_d_state = in_range(a.ssm_state, "--ssm-state", 1, 4096, c.ssm_d_state);
  c.ssm_d_inner = in_range(a.ssm_inner, "--ssm-inner", 128, kMaxDim, c.ssm_d_inner);
  c.ssm_n_v = in_range(a.ssm_v_heads, "--ssm-v-heads", 1, 4096, c.ssm_n_v);
  c.ssm_n_k = in_range(a.ssm_k_heads, "--ssm-k-heads", 1, 4096, c.ssm_n_k);
  c.n_ctx_train = in_range(a.ctx, "--ctx", 1, int64_t{1} << 31, c.n_ctx_train);
  if (a.attn_interval) {
    const uint32_t k = in_range(a.attn_interval, "--attn-interval", 1, 1 << 20, 4);
    c.recurrent.assign(c.n_layer, 0);
    for (uint32_t i = 0; i < c.n_layer; ++i) c.recurrent[i] = ((i + 1) % k) != 0;
  } else if (c.recurrent.size() != c.n_layer) {  // --layers changed: keep the preset's interval (4)
    c.recurrent.assign(c.n_layer, 0);
    for (uint32_t i = 0; i < c.n_layer; ++i) c.recurrent[i] = ((i + 1) % 4) != 0;
  }
  if (a.rot) {  // split n_rot/2 over three sections like the 27B ([11, 11, 10] for 64)
    const int32_t half = static_cast<int32_t>(c.n_rot / 2);
    for (int i = 0; i < 3; ++i) c.rope_sections[i] = half / 3 + (i < half % 3 ? 1 : 0);
    c.rope_sections[3] = 0;
  }
  if (c.n_head % c.n_head_kv)
    usage_fail("--heads {} / --kv-heads {}: heads must be a multiple of kv-heads", c.n_head, c.n_head_kv);
  if (c.n_rot % 2 || c.n_rot > c.head_dim_k)
    usage_fail("--rot {}: must be even and in [2, --head-dim = {}]", c.n_rot, c.head_dim_k);
  if (c.ssm_n_v % c.ssm_n_k)
    usage_fail("--ssm-v-heads {} / --ssm-k-heads {}: v-heads must be a multiple of k-heads", c.ssm_n_v,
               c.ssm_n_k);
  if (c.ssm_d_inner % c.ssm_n_v)
    usage_fail("--ssm-inner {}: must be a multiple of --ssm-v-heads = {}", c.ssm_d_inner, c.ssm_n_v);
  auto k128 = [](uint64_t v, const char* what) {
    if (v % 128) usage_fail("{} = {}: must be a multiple of 128 (one weight scale per 128 inputs)", what, v);
  };
  k128(c.n_embd, "--embd");
  k128(c.n_ff, "--ff");
  k128(c.ssm_d_inner, "--ssm-inner");
  bool any_attention = false;
  for (uint8_t r : c.recurrent) any_attention |= r == 0;
  if (any_attention)
    k128(uint64_t{c.n_head} * c.head_dim_v, "--heads x --head-dim (attn_output input width)");

  o.weight_type = parse_weight_type(a.type);
  if (!a.ab_type.empty()) o.ab_type = parse_ab_type(a.ab_type);
  o.seed = a.seed;
  o.with_vocab = !a.no_vocab;
  if (!a.name.empty()) o.name = a.name;
  c.tied_output = a.tied;
  o.hadamard_version = in_range(a.hadamard_version, "--hadamard-version", 1, 2, a.tied ? 2 : 1);
  if (a.tied && o.hadamard_version != 2)
    usage_fail("--tied with --hadamard-version 1: a tied head is folded only in version 2 (tied_output)");

  const std::vector<uint32_t> widths = folded_input_widths(c);
  o.hadamard_block = in_range(a.block, "--block", 1, 1 << 16, o.hadamard_block);
  bool divides = true;
  for (uint32_t k : widths) divides &= k % o.hadamard_block == 0;
  if ((o.hadamard_block & (o.hadamard_block - 1)) || !divides)
    usage_fail("--block {}: must be a power of two in [1, 65536] dividing every folded input width ({})",
               o.hadamard_block, fmt::join(widths, ", "));
  if (!a.twin.empty()) {
    if (a.twin == a.output) usage_fail("--unfolded-f32 {}: must differ from -o", a.twin);
    const uint64_t b = unfolded_f32_twin_bytes(o);
    if (b > kMaxTwinBytes)
      usage_fail(
          "--unfolded-f32: the F32 twin of this model would be {:.2f} GB, above the {:.2f} GB limit "
          "(use --preset tiny/small or smaller dimensions)",
          b / 1e9, kMaxTwinBytes / 1e9);
  }
  try {
    validate_synth_options(o);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    usage_fail("{}", e.what());
  }
  return o;
}

// Progress on stderr for large files: "tensor i/N, x/y GB", at most twice a second.
class ProgressLine {
 public:
  ProgressLine(std::string what, bool enabled) : what_(std::move(what)), enabled_(enabled), tty_(isatty(2)) {}
  void operator()(const SynthProgress& p) {
    if (!enabled_) return;
    const double t = seconds();
    const bool last = p.tensors_done == p.tensors_total;
    if (!last && t - last_ < 0.5) return;
    last_ = t;
    fmt::print(stderr, "{}synth: {} tensor {}/{}, {:.2f}/{:.2f} GB, {:.1f} s{}", tty_ ? "\r" : "", what_,
               p.tensors_done, p.tensors_total, p.bytes_done / 1e9, p.bytes_total / 1e9, t,
               tty_ && !last ? "" : "\n");
    std::fflush(stderr);
  }
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::string what_;
  bool enabled_, tty_;
  double last_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

void run_synth(const SynthCliOptions& a) {
  const SynthOptions o = build_options(a);
  constexpr uint64_t kProgressBytes = 64u << 20;
  const uint64_t bytes = synth_tensor_bytes(o);
  ProgressLine model_progress("model", !a.quiet && bytes >= kProgressBytes);
  write_synthetic_model(o, a.output, [&](const SynthProgress& p) { model_progress(p); });
  fmt::print("wrote {}: {} {} tensor bytes ({:.3f} GB), seed {}, block {}, {:.2f} s\n", a.output,
             dtype_name(o.weight_type), bytes, bytes / 1e9, o.seed, o.hadamard_block,
             model_progress.seconds());
  if (!a.twin.empty()) {
    const uint64_t tb = unfolded_f32_twin_bytes(o);
    ProgressLine twin_progress("twin", !a.quiet && tb >= kProgressBytes);
    write_unfolded_f32_twin(o, a.twin, [&](const SynthProgress& p) { twin_progress(p); });
    fmt::print("wrote {}: unfolded F32 twin, {} tensor bytes, {:.2f} s\n", a.twin, tb,
               twin_progress.seconds());
  }
}

}  // namespace

void add_synth(CLI::App& app) {
  auto a = std::make_shared<SynthCliOptions>();
  auto* cmd =
      app.add_subcommand("synth", "Write a synthetic Bonsai-2-format (qwen35, Hadamard-folded) model");
  cmd->add_option("--preset", a->preset, "tiny | small | 27b (shapes, block, alpha/beta type)")
      ->capture_default_str();
  cmd->add_option("-o,--output", a->output, "Output GGUF file")->required();
  cmd->add_option("--seed", a->seed, "RNG seed (same seed -> identical bytes)")->capture_default_str();
  cmd->add_option("--type", a->type, "Ternary weight type: pq2_0 | ptq1_0 | q2_0-g128 | q2_0-g64")
      ->capture_default_str();
  cmd->add_option("--ab-type", a->ab_type, "ssm_alpha/ssm_beta type: bf16 | f16 | f32 (default: preset's)");
  cmd->add_option("--block", a->block, "Hadamard block size (power of two dividing every folded K)");
  cmd->add_flag("--tied", a->tied, "No output.weight: token_embd is the head (prism.hadamard version 2)");
  cmd->add_option("--hadamard-version", a->hadamard_version,
                  "prism.hadamard.version: 1 | 2 (default 1; 2 with --tied)");
  cmd->add_flag("--no-vocab", a->no_vocab,
                "tokenizer.ggml.model = no_vocab (logits-only, like the fixtures)");
  cmd->add_option("--unfolded-f32", a->twin, "Also write the equivalent unrotated all-F32 twin to this file");
  cmd->add_option("--name", a->name, "general.name (default bonsai-synth-<preset>)");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress on stderr");
  auto* g = "Dimension overrides";
  cmd->add_option("--layers", a->layers, "block_count")->group(g);
  cmd->add_option("--embd", a->embd, "embedding_length (multiple of 128)")->group(g);
  cmd->add_option("--ff", a->ff, "feed_forward_length (multiple of 128)")->group(g);
  cmd->add_option("--vocab", a->vocab, "vocab size (>= 261 with a vocabulary)")->group(g);
  cmd->add_option("--heads", a->heads, "attention.head_count")->group(g);
  cmd->add_option("--kv-heads", a->kv_heads, "attention.head_count_kv")->group(g);
  cmd->add_option("--head-dim", a->head_dim, "attention.key_length = value_length")->group(g);
  cmd->add_option("--rot", a->rot, "rope.dimension_count (even, <= head-dim)")->group(g);
  cmd->add_option("--ssm-state", a->ssm_state, "ssm.state_size (GDN head dim)")->group(g);
  cmd->add_option("--ssm-inner", a->ssm_inner, "ssm.inner_size (multiple of 128 and of v-heads)")->group(g);
  cmd->add_option("--ssm-v-heads", a->ssm_v_heads, "ssm.time_step_rank")->group(g);
  cmd->add_option("--ssm-k-heads", a->ssm_k_heads, "ssm.group_count")->group(g);
  cmd->add_option("--attn-interval", a->attn_interval, "full_attention_interval")->group(g);
  cmd->add_option("--ctx", a->ctx, "context_length")->group(g);
  cmd->callback([a] { run_synth(*a); });
}

}  // namespace bonsai::cli
