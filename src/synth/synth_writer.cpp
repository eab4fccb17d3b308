// write_synthetic_model / write_unfolded_f32_twin: metadata and streaming
// tensor producers. Ternary matrices are generated in row chunks inside the
// GgufWriter producer (rows in parallel, each row its own RNG stream), so
// memory stays bounded by one chunk whatever the model size.
#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "bonsai/error.h"
#include "bonsai/gguf_writer.h"
#include "kernels/ref/fwht.h"
#include "synth/synth_internal.h"

namespace bonsai {
namespace {

using synth::RowScratch;

constexpr uint64_t kChunkBytes = 8u << 20;      // output bytes generated per producer step
constexpr int64_t kParallelMinElems = 1 << 16;  // below this a chunk is generated on one thread

// The full_attention_interval that reproduces c.recurrent, if there is one.
std::optional<uint32_t> attention_interval(const ModelConfig& c) {
  for (uint32_t k = 1; k <= c.n_layer + 1; ++k) {
    bool ok = true;
    for (uint32_t i = 0; i < c.n_layer && ok; ++i) ok = (c.recurrent[i] != 0) == (((i + 1) % k) != 0);
    if (ok) return k;
  }
  return std::nullopt;
}

void add_model_keys(GgufWriter& w, const SynthOptions& o, const std::string& name) {
  const ModelConfig& c = o.config;
  auto k = [](const char* s) { return std::string("qwen35.") + s; };
  w.add_string("general.architecture", "qwen35");
  w.add_string("general.name", name);
  w.add_u32(k("context_length"), c.n_ctx_train);
  w.add_u32(k("embedding_length"), c.n_embd);
  w.add_u32(k("block_count"), c.n_layer);
  w.add_u32(k("feed_forward_length"), c.n_ff);
  w.add_u32(k("attention.head_count"), c.n_head);
  w.add_u32(k("attention.head_count_kv"), c.n_head_kv);
  w.add_u32(k("attention.key_length"), c.head_dim_k);
  w.add_u32(k("attention.value_length"), c.head_dim_v);
  w.add_f32(k("attention.layer_norm_rms_epsilon"), c.rms_eps);
  w.add_u32(k("rope.dimension_count"), c.n_rot);
  w.add_array_i32(k("rope.dimension_sections"), c.rope_sections);
  w.add_f32(k("rope.freq_base"), c.rope_base);
  w.add_u32(k("ssm.conv_kernel"), c.ssm_conv);
  w.add_u32(k("ssm.inner_size"), c.ssm_d_inner);
  w.add_u32(k("ssm.state_size"), c.ssm_d_state);
  w.add_u32(k("ssm.time_step_rank"), c.ssm_n_v);
  w.add_u32(k("ssm.group_count"), c.ssm_n_k);
  if (auto interval = attention_interval(c)) {
    w.add_u32(k("full_attention_interval"), *interval);
  } else {
    std::vector<uint8_t> r(c.recurrent.begin(), c.recurrent.end());
    w.add_array_raw(k("attention.recurrent_layers"), GgufType::BOOL, r.data(), r.size());
  }
  w.add_u32(k("vocab_size"), c.n_vocab);
}

void add_vocab_keys(GgufWriter& w, const SynthOptions& o) {
  if (!o.with_vocab) {
    w.add_string("tokenizer.ggml.model", "no_vocab");
    return;
  }
  const SynthVocab v = build_synth_vocab(o.config.n_vocab);
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string("tokenizer.ggml.pre", "qwen35");
  w.add_array_strings("tokenizer.ggml.tokens", v.tokens);
  w.add_array_i32("tokenizer.ggml.token_type", v.types);
  w.add_array_strings("tokenizer.ggml.merges", v.merges);
  w.add_u32("tokenizer.ggml.bos_token_id", v.bos_id);
  w.add_u32("tokenizer.ggml.eos_token_id", v.eos_id);
  w.add_u32("tokenizer.ggml.padding_token_id", v.bos_id);
  w.add_bool("tokenizer.ggml.add_bos_token", false);
  w.add_string("tokenizer.chat_template", synth_chat_template());
}

void add_hadamard_keys(GgufWriter& w, const SynthOptions& o) {
  const ModelConfig& c = o.config;
  w.add_u32("prism.hadamard.version", o.hadamard_version);
  if (c.tied_output) w.add_bool("prism.hadamard.tied_output", true);
  w.add_u32("prism.hadamard.block_size", o.hadamard_block);
  w.add_string("prism.hadamard.transform", "normalized-sylvester-walsh-hadamard");
  w.add_string("prism.hadamard.axis", "input-last-dimension");
  w.add_string("prism.hadamard.sign_mode", "explicit");
  std::vector<int32_t> widths;
  for (uint32_t x : folded_input_widths(c)) widths.push_back(static_cast<int32_t>(x));
  w.add_array_i32("prism.hadamard.sign_widths", widths);
  w.add_array_i32("prism.hadamard.sign_values", synth::hadamard_signs(o));
  std::vector<std::string> names;
  for (const TensorSpec& t : tensor_inventory(c))
    if (t.role == TensorRole::Folded) names.push_back(t.name);
  w.add_array_strings("prism.hadamard.weight_names", names);
  w.add_array_strings("prism.hadamard.inverse_weight_names", {"token_embd.weight"});
  w.add_bool("prism.hadamard.gdn_v_grouped", true);
}

uint64_t n_elements(const TensorSpec& t) {
  uint64_t n = 1;
  for (uint64_t d : t.ne) n *= d;
  return n;
}

bool is_ternary(const TensorSpec& t) {
  return t.role == TensorRole::Folded || t.role == TensorRole::Embedding;
}

uint64_t stored_bytes(const TensorSpec& t, const SynthOptions& o) {
  return row_bytes(synth::storage_type(t, o), t.ne[0]) * (n_elements(t) / t.ne[0]);
}

// Everything a producer needs, shared by all producers of one file.
struct Context {
  SynthOptions opts;
  int workers = 1;
  std::map<uint32_t, std::vector<float>> signs;  // folded input width -> s_K (twin only)
};

// Streams a {K, N} matrix: fill(row, scratch, dst) writes one row of
// `row_nbytes` bytes; rows are generated chunk by chunk, in parallel.
template <typename Fill>
void stream_rows(ByteSink& sink, const Context& ctx, uint64_t k, uint64_t n_rows, uint64_t row_nbytes,
                 Fill fill) {
  const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunkBytes / row_nbytes);
  std::vector<uint8_t> buf(std::min(rows_per_chunk, n_rows) * row_nbytes);
  std::vector<RowScratch> scratch;
  for (int i = 0; i < ctx.workers; ++i) scratch.emplace_back(static_cast<int64_t>(k));
  for (uint64_t r0 = 0; r0 < n_rows; r0 += rows_per_chunk) {
    const uint64_t n = std::min(rows_per_chunk, n_rows - r0);
    const int workers = static_cast<int64_t>(n * k) < kParallelMinElems ? 1 : ctx.workers;
    synth::parallel_rows(static_cast<int64_t>(n), workers, [&](int64_t a, int64_t b, int w) {
      for (int64_t r = a; r < b; ++r) fill(r0 + r, scratch[w], buf.data() + r * row_nbytes);
    });
    sink.write(buf.data(), n * row_nbytes);
  }
}

void check_twin_size(const SynthOptions& o) {
  const uint64_t b = unfolded_f32_twin_bytes(o);
  if (b > kMaxTwinBytes)
    fail(
        "synth: the unfolded F32 twin of this model would hold {:.2f} GB of F32 tensors, above the {:.2f} GB "
        "limit; "
        "write it for a smaller model (e.g. --preset tiny or small)",
        b / 1e9, kMaxTwinBytes / 1e9);
}

void write_file(const GgufWriter& w, const std::string& path, const std::vector<uint64_t>& nbytes,
                const SynthProgressFn& progress) {
  std::vector<uint64_t> cum(nbytes.size() + 1, 0);
  for (size_t i = 0; i < nbytes.size(); ++i) cum[i + 1] = cum[i] + nbytes[i];
  std::function<void(size_t, size_t)> cb;
  if (progress)
    cb = [&](size_t done, size_t total) { progress(SynthProgress{done, total, cum[done], cum.back()}); };
  w.write_file(path, cb);
}

}  // namespace

uint64_t synth_tensor_bytes(const SynthOptions& o) {
  uint64_t b = 0;
  for (const TensorSpec& t : tensor_inventory(o.config)) b += stored_bytes(t, o);
  return b;
}

uint64_t unfolded_f32_twin_bytes(const SynthOptions& o) {
  uint64_t b = 0;
  for (const TensorSpec& t : tensor_inventory(o.config)) b += 4 * n_elements(t);
  return b;
}

void write_synthetic_model(const SynthOptions& o, const std::string& path, const SynthProgressFn& progress) {
  validate_synth_options(o);
  auto ctx = std::make_shared<Context>();
  ctx->opts = o;
  ctx->workers = synth::worker_count();
  GgufWriter w;
  add_model_keys(w, o, o.name);
  add_vocab_keys(w, o);
  add_hadamard_keys(w, o);
  std::vector<uint64_t> sizes;
  for (const TensorSpec& spec : tensor_inventory(o.config)) {
    const DType t = synth::storage_type(spec, o);
    const uint64_t nbytes = stored_bytes(spec, o);
    sizes.push_back(nbytes);
    if (is_ternary(spec)) {
      w.add_tensor(spec.name, dtype_info(t).ggml_id, spec.ne, nbytes, [ctx, spec, t](ByteSink& sink) {
        const uint64_t k = spec.ne[0], key = synth::stream_key(ctx->opts.seed, spec.name);
        stream_rows(sink, *ctx, k, spec.ne[1], row_bytes(t, k),
                    [&](uint64_t row, RowScratch& s, uint8_t* dst) {
                      synth::ternary_row(t, key, row, static_cast<int64_t>(k), s, dst);
                    });
      });
    } else {
      w.add_tensor_bytes(spec.name, dtype_info(t).ggml_id, spec.ne,
                         synth::encode_floats(t, synth::float_tensor_values(spec, o.seed, t)));
    }
  }
  write_file(w, path, sizes, progress);
}

void write_unfolded_f32_twin(const SynthOptions& o, const std::string& path,
                             const SynthProgressFn& progress) {
  validate_synth_options(o);
  check_twin_size(o);
  auto ctx = std::make_shared<Context>();
  ctx->opts = o;
  ctx->workers = synth::worker_count();
  {
    const std::vector<int32_t> all = synth::hadamard_signs(o);
    size_t at = 0;
    for (uint32_t k : folded_input_widths(o.config)) {
      ctx->signs[k] = std::vector<float>(all.begin() + at, all.begin() + at + k);
      at += k;
    }
  }
  const ModelConfig& c = o.config;
  GgufWriter w;
  add_model_keys(w, o, o.name + "-unfolded-f32");
  add_vocab_keys(w, o);
  std::vector<uint64_t> sizes;
  for (const TensorSpec& spec : tensor_inventory(c)) {
    const uint64_t nbytes = 4 * n_elements(spec);
    sizes.push_back(nbytes);
    if (!is_ternary(spec)) {
      w.add_tensor_bytes(spec.name, ggml_type::F32, spec.ne,
                         synth::encode_floats(DType::F32, synth::float_tensor_values(
                                                              spec, o.seed, synth::storage_type(spec, o))));
      continue;
    }
    const bool ssm_out = spec.name.ends_with(".ssm_out.weight");
    w.add_tensor(spec.name, ggml_type::F32, spec.ne, nbytes, [ctx, spec, ssm_out](ByteSink& sink) {
      const SynthOptions& so = ctx->opts;
      const ModelConfig& cc = so.config;
      const DType t = so.weight_type;
      const uint64_t k = spec.ne[0], key = synth::stream_key(so.seed, spec.name);
      const float* signs = ctx->signs.at(static_cast<uint32_t>(k)).data();
      const int64_t kk = static_cast<int64_t>(k), block = so.hadamard_block;
      stream_rows(sink, *ctx, k, spec.ne[1], 4 * k, [&](uint64_t row, RowScratch& s, uint8_t* dst) {
        // Stored row w -> s_K ⊙ FWHT_B(w)/√B (the same formula for the embedding).
        synth::ternary_row(t, key, row, kk, s, s.stored.data());
        dequantize_row(t, s.stored.data(), s.values.data(), kk);
        ref::hadamard_inverse(s.values.data(), signs, s.rotated.data(), kk, block);
        if (!ssm_out) {
          std::memcpy(dst, s.rotated.data(), 4 * k);
          return;
        }
        // ssm_out columns: the folded row is in grouped head order (g = k·rep + r);
        // the twin, like an unrotated llama.cpp file, is tiled (t = r·n_k + k).
        const uint32_t hv = cc.ssm_head_v_dim(), nk = cc.ssm_n_k, rep = cc.ssm_n_v / cc.ssm_n_k;
        for (uint32_t th = 0; th < cc.ssm_n_v; ++th) {
          const uint32_t r = th / nk, kh = th % nk, g = kh * rep + r;
          std::memcpy(dst + 4ull * th * hv, s.rotated.data() + uint64_t{g} * hv, 4ull * hv);
        }
      });
    });
  }
  write_file(w, path, sizes, progress);
}

}  // namespace bonsai
