// Synthetic model writer: file structure against tensor_inventory, config
// round trip, prism.hadamard keys, determinism, weight statistics, the 27B
// byte budget, the unfolded F32 twin (checked with explicit dense Hadamard
// matrices) and the BPE vocabulary.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <unordered_set>

#include "bonsai/config.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/synth.h"
#include "bonsai/tokenizer.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;

// A temp file removed at scope exit; unique per process and tag because
// ctest runs the tests of this binary as parallel processes.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& tag)
      : path(
            (fs::temp_directory_path() / ("bonsai_synth_" + tag + "_" + std::to_string(::getpid()) + ".gguf"))
                .string()) {}
  ~TempFile() {
    std::error_code ec;
    fs::remove(path, ec);
  }
};

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

SynthOptions tiny(uint64_t seed = 1) {
  SynthOptions o = synth_preset("tiny");
  o.seed = seed;
  return o;
}

std::vector<float> dequant_tensor(const GgufTensor& t) {
  std::vector<float> v(t.nelements);
  dequantize_row(t.dtype, t.data, v.data(), static_cast<int64_t>(t.nelements));
  return v;
}

// ---- structure -------------------------------------------------------------------

TEST(Synth, TinyMatchesInventoryAndRoundTripsConfig) {
  TempFile tmp("tiny");
  const SynthOptions o = tiny();
  write_synthetic_model(o, tmp.path);
  GgufFile f = GgufFile::open(tmp.path);
  EXPECT_EQ(f.get_string("general.architecture"), "qwen35");
  const auto inv = tensor_inventory(o.config);
  ASSERT_EQ(f.tensors().size(), inv.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.name, inv[i].name);
    EXPECT_EQ(t.ne, inv[i].ne) << t.name;
    switch (inv[i].role) {
      case TensorRole::Folded:
      case TensorRole::Embedding:
        EXPECT_EQ(t.dtype, DType::PQ2_0) << t.name;
        break;
      case TensorRole::SsmAB:
        EXPECT_EQ(t.dtype, DType::F32) << t.name;
        break;  // tiny: F32 like the fixture
      case TensorRole::Norm:
      case TensorRole::SsmParam:
        EXPECT_EQ(t.dtype, DType::F32) << t.name;
        break;
    }
  }
  const ModelConfig c = ModelConfig::from_gguf(f);
  const ModelConfig& e = o.config;
  EXPECT_EQ(c.n_layer, e.n_layer);
  EXPECT_EQ(c.n_embd, e.n_embd);
  EXPECT_EQ(c.n_ff, e.n_ff);
  EXPECT_EQ(c.n_vocab, 1024u);
  EXPECT_EQ(c.n_ctx_train, e.n_ctx_train);
  EXPECT_EQ(c.n_head, e.n_head);
  EXPECT_EQ(c.n_head_kv, e.n_head_kv);
  EXPECT_EQ(c.head_dim_k, e.head_dim_k);
  EXPECT_EQ(c.head_dim_v, e.head_dim_v);
  EXPECT_EQ(c.n_rot, e.n_rot);
  EXPECT_EQ(c.rope_base, e.rope_base);
  EXPECT_EQ(c.rope_sections, (std::array<int32_t, 4>{6, 5, 5, 0}));
  EXPECT_EQ(c.ssm_d_state, e.ssm_d_state);
  EXPECT_EQ(c.ssm_d_inner, e.ssm_d_inner);
  EXPECT_EQ(c.ssm_n_v, e.ssm_n_v);
  EXPECT_EQ(c.ssm_n_k, e.ssm_n_k);
  EXPECT_EQ(c.ssm_conv, e.ssm_conv);
  EXPECT_EQ(c.rms_eps, e.rms_eps);
  EXPECT_EQ(c.recurrent, (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_FALSE(c.tied_output);
  EXPECT_EQ(f.get_u32("qwen35.full_attention_interval"), 4u);
}

TEST(Synth, MatchesFixtureKeyLayout) {
  // Same keys, in the same order and with the same value types, as the
  // reference fixture of the same shape (vocab keys aside).
  const std::string fixture = std::string(BONSAI_FIXTURES_DIR) + "/tiny-b128/model.pq2_0.gguf";
  if (!fs::exists(fixture)) GTEST_SKIP() << "no fixture " << fixture;
  TempFile tmp("layout");
  SynthOptions o = tiny();
  o.with_vocab = false;
  o.config.n_vocab = 512;
  write_synthetic_model(o, tmp.path);
  GgufFile a = GgufFile::open(fixture), b = GgufFile::open(tmp.path);
  ASSERT_EQ(a.metadata().size(), b.metadata().size());
  for (size_t i = 0; i < a.metadata().size(); ++i) {
    const auto& [ka, va] = a.metadata()[i];
    const auto& [kb, vb] = b.metadata()[i];
    EXPECT_EQ(ka, kb);
    EXPECT_EQ(va.type, vb.type) << ka;
    EXPECT_EQ(va.elem_type, vb.elem_type) << ka;
    if (ka != "general.name" && ka != "prism.hadamard.sign_values") {
      EXPECT_EQ(va.summary(1000), vb.summary(1000)) << ka;
    }
  }
  ASSERT_EQ(a.tensors().size(), b.tensors().size());
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    EXPECT_EQ(a.tensors()[i].name, b.tensors()[i].name);
    EXPECT_EQ(a.tensors()[i].ne, b.tensors()[i].ne);
    EXPECT_EQ(a.tensors()[i].ggml_type, b.tensors()[i].ggml_type) << a.tensors()[i].name;
  }
}

void check_hadamard_keys(const GgufFile& f, uint32_t block, bool tied) {
  EXPECT_EQ(f.get_u32("prism.hadamard.version"), tied ? 2u : 1u);
  EXPECT_EQ(f.has("prism.hadamard.tied_output"), tied);
  if (tied) {
    EXPECT_TRUE(f.get_bool("prism.hadamard.tied_output"));
  }
  EXPECT_EQ(f.find_tensor("output.weight") != nullptr, !tied);
  EXPECT_EQ(f.get_u32("prism.hadamard.block_size"), block);
  EXPECT_EQ(f.get_string("prism.hadamard.transform"), "normalized-sylvester-walsh-hadamard");
  EXPECT_EQ(f.get_string("prism.hadamard.axis"), "input-last-dimension");
  EXPECT_EQ(f.get_string("prism.hadamard.sign_mode"), "explicit");
  EXPECT_TRUE(f.get_bool("prism.hadamard.gdn_v_grouped"));
  const GgufValue& inv = f.get_array("prism.hadamard.inverse_weight_names");
  ASSERT_EQ(inv.strings.size(), 1u);
  EXPECT_EQ(inv.strings[0], "token_embd.weight");

  const GgufValue& widths = f.get_array("prism.hadamard.sign_widths", GgufType::I32);
  const GgufValue& values = f.get_array("prism.hadamard.sign_values", GgufType::I32);
  std::vector<int64_t> w;
  uint64_t total = 0;
  for (uint64_t i = 0; i < widths.count; ++i) {
    w.push_back(widths.elem_i64(i));
    total += widths.elem_i64(i);
    if (i) {
      EXPECT_LT(w[i - 1], w[i]) << "sign_widths must be distinct and ascending";
    }
  }
  ASSERT_EQ(values.count, total);
  int64_t plus = 0;
  for (uint64_t i = 0; i < values.count; ++i) {
    const int64_t s = values.elem_i64(i);
    ASSERT_TRUE(s == 1 || s == -1) << i;
    plus += s == 1;
  }
  // Random signs: 5 sigma of a fair coin.
  EXPECT_NEAR(plus, total / 2.0, 5 * std::sqrt(total / 4.0));

  // weight_names = exactly the ternary tensors except token_embd; every one
  // exists and its K is a sign width divisible by the block.
  const GgufValue& names = f.get_array("prism.hadamard.weight_names");
  std::set<std::string> listed;
  for (auto n : names.strings) {
    const GgufTensor* t = f.find_tensor(n);
    ASSERT_NE(t, nullptr) << n;
    EXPECT_TRUE(listed.insert(std::string(n)).second) << "duplicate " << n;
    EXPECT_NE(std::find(w.begin(), w.end(), static_cast<int64_t>(t->ne[0])), w.end()) << n;
    EXPECT_EQ(t->ne[0] % block, 0u) << n;
  }
  std::set<int64_t> used;
  for (const auto& t : f.tensors()) {
    const bool ternary = t.dtype == DType::PQ2_0 || t.dtype == DType::PTQ1_0 || t.dtype == DType::Q2_0_G128 ||
                         t.dtype == DType::Q2_0_G64;
    if (ternary && t.name != "token_embd.weight") {
      EXPECT_TRUE(listed.count(t.name)) << t.name << " is ternary but not in weight_names";
      used.insert(static_cast<int64_t>(t.ne[0]));
    }
  }
  used.insert(static_cast<int64_t>(f.tensor("token_embd.weight").ne[0]));
  EXPECT_EQ(std::vector<int64_t>(used.begin(), used.end()), w) << "sign_widths = the folded input widths";
}

TEST(Synth, HadamardKeysUntiedAndTied) {
  {
    TempFile tmp("had1");
    write_synthetic_model(tiny(), tmp.path);
    check_hadamard_keys(GgufFile::open(tmp.path), 128, false);
  }
  {
    TempFile tmp("had2");
    SynthOptions o = synth_preset("small");
    o.config.tied_output = true;
    o.hadamard_version = 2;
    o.with_vocab = false;
    o.config.n_layer = 2;  // both GDN: fewer bytes, same keys
    o.config.recurrent = {1, 1};
    write_synthetic_model(o, tmp.path);
    GgufFile f = GgufFile::open(tmp.path);
    check_hadamard_keys(f, 1024, true);
    EXPECT_TRUE(ModelConfig::from_gguf(f).tied_output);
    EXPECT_EQ(f.tensor("blk.0.ssm_alpha.weight").dtype, DType::BF16);
  }
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherBytes) {
  TempFile a("seed_a"), b("seed_b"), c("seed_c");
  write_synthetic_model(tiny(7), a.path);
  write_synthetic_model(tiny(7), b.path);
  write_synthetic_model(tiny(8), c.path);
  const auto ba = read_bytes(a.path), bb = read_bytes(b.path), bc = read_bytes(c.path);
  ASSERT_FALSE(ba.empty());
  EXPECT_TRUE(ba == bb);
  ASSERT_EQ(ba.size(), bc.size());  // same shapes and vocab
  EXPECT_FALSE(ba == bc);
  // Different seeds differ in every ternary tensor, not just somewhere.
  GgufFile fa = GgufFile::open(a.path), fc = GgufFile::open(c.path);
  for (size_t i = 0; i < fa.tensors().size(); ++i)
    EXPECT_NE(std::memcmp(fa.tensors()[i].data, fc.tensors()[i].data, fa.tensors()[i].nbytes), 0)
        << fa.tensors()[i].name;
}

TEST(Synth, ValidationRejectsBadOptions) {
  SynthOptions o = tiny();
  o.hadamard_block = 96;
  EXPECT_THROW(validate_synth_options(o), Error);
  o.hadamard_block = 1024;  // does not divide 256
  EXPECT_THROW(validate_synth_options(o), Error);
  o = tiny();
  o.config.tied_output = true;  // version 1 cannot fold a tied head
  EXPECT_THROW(validate_synth_options(o), Error);
  o = tiny();
  o.config.n_vocab = 260;
  EXPECT_THROW(validate_synth_options(o), Error);
  o.with_vocab = false;
  EXPECT_NO_THROW(validate_synth_options(o));
  o = tiny();
  o.ab_type = DType::Q8_0;
  EXPECT_THROW(validate_synth_options(o), Error);
  EXPECT_THROW(synth_preset("huge"), Error);
}

// ---- weights ---------------------------------------------------------------------

TEST(Synth, TernaryStatisticsKeepActivationsOrderOne) {
  TempFile tmp("stats");
  SynthOptions o = tiny();
  o.with_vocab = false;
  write_synthetic_model(o, tmp.path);
  GgufFile f = GgufFile::open(tmp.path);
  const GgufTensor& t = f.tensor("blk.0.attn_qkv.weight");  // {256, 1024}: 262144 codes
  std::vector<uint8_t> codes(t.nelements);
  std::vector<uint16_t> scales(t.nelements / 128);
  decode_ternary_codes(t.dtype, t.data, codes.data(), scales.data(), static_cast<int64_t>(t.nelements));
  int64_t hist[4] = {};
  for (uint8_t c : codes) ++hist[c];
  EXPECT_EQ(hist[3], 0);
  // p = 79/256, 98/256, 79/256; n = 262144 -> sd of a fraction < 0.001; 0.01 is > 10 sigma.
  const double n = static_cast<double>(codes.size());
  EXPECT_NEAR(hist[0] / n, 0.31, 0.01);
  EXPECT_NEAR(hist[1] / n, 0.38, 0.01);
  EXPECT_NEAR(hist[2] / n, 0.31, 0.01);
  const double d0 = 1.0 / std::sqrt(0.62 * 256);
  for (uint16_t s : scales) {
    const double d = fp16_to_f32(s);
    EXPECT_GE(d, 0.7 * d0 * (1 - 1e-3));  // ±30 % jitter, fp16 rounding < 0.05 %
    EXPECT_LE(d, 1.3 * d0 * (1 + 1e-3));
  }
  // Mean squared row norm = K E[c^2] E[d^2] = 0.617/0.62 * (1 + 0.3^2/3) = 1.024.
  // Over 1024 rows its sampling sd is ~0.003; 0.05 is generous.
  const std::vector<float> w = dequant_tensor(t);
  double sum = 0;
  for (float x : w) sum += double{x} * x;
  EXPECT_NEAR(sum / t.ne[1], 1.024, 0.05);
  // Small tensors: ssm_a < 0 within -exp([0, 2.5]); norms around 1.
  const std::vector<float> a = dequant_tensor(f.tensor("blk.0.ssm_a"));
  for (float x : a) {
    EXPECT_LE(x, -1.0f);
    EXPECT_GE(x, -std::exp(2.5f) * 1.0001f);
  }
  const std::vector<float> norm = dequant_tensor(f.tensor("output_norm.weight"));
  double mean = 0;
  for (float x : norm) mean += x / norm.size();
  EXPECT_NEAR(mean, 1.0, 0.05);  // 1 + N(0, 0.1): sd of the mean over 256 = 0.006
}

TEST(Synth, AllTernaryFormatsHoldTheSameValues) {
  // The 2-bit formats use a fast packer, PTQ1_0 the library encoder: with one
  // seed all four must decode to identical values, and re-encoding the PQ2_0
  // codes with encode_ternary_row must reproduce the written bytes.
  std::map<DType, std::string> files;
  std::vector<std::unique_ptr<TempFile>> tmps;
  for (DType t : {DType::PQ2_0, DType::PTQ1_0, DType::Q2_0_G128, DType::Q2_0_G64}) {
    SynthOptions o = tiny(11);
    o.with_vocab = false;
    o.weight_type = t;
    tmps.push_back(std::make_unique<TempFile>("fmt" + std::to_string(static_cast<int>(t))));
    write_synthetic_model(o, tmps.back()->path);
    files[t] = tmps.back()->path;
  }
  GgufFile ref = GgufFile::open(files[DType::PQ2_0]);
  for (const auto& [t, path] : files) {
    GgufFile f = GgufFile::open(path);
    for (const GgufTensor& rt : ref.tensors()) {
      const GgufTensor& x = f.tensor(rt.name);
      if (rt.dtype != DType::PQ2_0) continue;
      EXPECT_EQ(x.dtype, t) << rt.name;
      EXPECT_EQ(dequant_tensor(x), dequant_tensor(rt)) << rt.name << " in " << dtype_name(t);
    }
  }
  for (const GgufTensor& rt : ref.tensors()) {
    if (rt.dtype != DType::PQ2_0) continue;
    std::vector<uint8_t> codes(rt.nelements), again(rt.nbytes);
    std::vector<uint16_t> s16(rt.nelements / 128);
    decode_ternary_codes(DType::PQ2_0, rt.data, codes.data(), s16.data(), static_cast<int64_t>(rt.nelements));
    std::vector<float> scales(s16.size());
    for (size_t i = 0; i < s16.size(); ++i) scales[i] = fp16_to_f32(s16[i]);
    encode_ternary_row(DType::PQ2_0, codes.data(), scales.data(), again.data(),
                       static_cast<int64_t>(rt.nelements));
    EXPECT_EQ(std::memcmp(again.data(), rt.data, rt.nbytes), 0) << rt.name;
  }
}

TEST(Synth, Inventory27bHas851TensorsAnd7137GBofPQ2) {
  const SynthOptions o = synth_preset("27b");
  const auto inv = tensor_inventory(o.config);
  EXPECT_EQ(inv.size(), 851u);
  // PQ2_0: 34 bytes per 128 weights (SPEC §2), computed here from the shapes.
  uint64_t ternary = 0, other = 0;
  for (const auto& t : inv) {
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    if (t.role == TensorRole::Folded || t.role == TensorRole::Embedding)
      ternary += n / 128 * 34;
    else
      other += n * (t.role == TensorRole::SsmAB ? 2 : 4);  // BF16 alpha/beta, F32 rest
  }
  EXPECT_NEAR(ternary / 1e9, 7.137, 7.137 * 0.005);
  EXPECT_EQ(synth_tensor_bytes(o), ternary + other);
  EXPECT_EQ(folded_input_widths(o.config), (std::vector<uint32_t>{5120, 6144, 17408}));
  // Far above the twin limit: refused before anything is written.
  EXPECT_GT(unfolded_f32_twin_bytes(o), kMaxTwinBytes);
  TempFile tmp("twin27");
  EXPECT_THROW(write_unfolded_f32_twin(o, tmp.path), Error);
  EXPECT_FALSE(fs::exists(tmp.path));
}

// ---- the unfolded F32 twin --------------------------------------------------------

// Dense normalized Sylvester Hadamard matrix: H[r][c] = (-1)^popcount(r&c) / sqrt(B).
std::vector<double> dense_hadamard(uint32_t b) {
  std::vector<double> h(uint64_t{b} * b);
  for (uint32_t r = 0; r < b; ++r)
    for (uint32_t c = 0; c < b; ++c)
      h[uint64_t{r} * b + c] = (std::popcount(r & c) % 2 ? -1.0 : 1.0) / std::sqrt(b);
  return h;
}

// Block-diagonal H applied to v (H symmetric, so H v = Hᵀ v).
std::vector<double> apply_blocks(const std::vector<double>& h, uint32_t b, const std::vector<double>& v) {
  std::vector<double> out(v.size(), 0.0);
  for (size_t o = 0; o < v.size(); o += b)
    for (uint32_t r = 0; r < b; ++r)
      for (uint32_t c = 0; c < b; ++c) out[o + r] += h[uint64_t{r} * b + c] * v[o + c];
  return out;
}

std::vector<double> signs_for(const GgufFile& f, uint64_t k) {
  const GgufValue& widths = f.get_array("prism.hadamard.sign_widths");
  const GgufValue& values = f.get_array("prism.hadamard.sign_values");
  uint64_t at = 0;
  for (uint64_t i = 0; i < widths.count; ++i) {
    if (static_cast<uint64_t>(widths.elem_i64(i)) == k) {
      std::vector<double> s(k);
      for (uint64_t j = 0; j < k; ++j) s[j] = static_cast<double>(values.elem_i64(at + j));
      return s;
    }
    at += widths.elem_i64(i);
  }
  ADD_FAILURE() << "no sign width " << k;
  return std::vector<double>(k, 1.0);
}

// y = W x for an {K, N} F32/ternary tensor, in double.
std::vector<double> matvec(const GgufTensor& t, const std::vector<double>& x) {
  const std::vector<float> w = dequant_tensor(t);
  const uint64_t k = t.ne[0], n = t.ne[1];
  std::vector<double> y(n, 0.0);
  for (uint64_t r = 0; r < n; ++r)
    for (uint64_t c = 0; c < k; ++c) y[r] += double{w[r * k + c]} * x[c];
  return y;
}

std::vector<double> random_vector(uint64_t n, uint64_t seed) {
  std::vector<double> x(n);
  uint64_t s = seed;
  for (auto& v : x) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<double>(static_cast<int64_t>(s >> 11) % 2001 - 1000) / 577.0;  // ~ unit variance
  }
  return x;
}

// The twin computes without rotation what the folded file computes with it:
//   folded:  y = W_stored · blockH(s_K ⊙ P x)   (P: tiled -> grouped heads, ssm_out only)
//   twin:    y = W_twin · x
// Error bound: the twin rows went through an F32 FWHT (log2 B <= 8 roundings
// of terms ~0.05), so each twin element is off by < 1e-7 absolutely; y sums
// K <= 1024 of them times |x| < 1.8: < 2e-4 worst case, ~1e-6 typical. 1e-4.
TEST(SynthTwin, FoldedAndUnfoldedComputeTheSame) {
  SynthOptions o = tiny(5);
  o.with_vocab = false;
  o.ab_type = DType::BF16;  // the twin must widen BF16 exactly
  o.hadamard_block = 256;
  o.config.n_layer = 1;
  o.config.recurrent = {1};
  o.config.ssm_n_v = 8;  // rep = 4: the grouped/tiled permutation is not an involution
  o.config.ssm_n_k = 2;
  o.config.ssm_d_inner = 1024;
  for (bool tied : {false, true}) {
    o.config.tied_output = tied;
    o.hadamard_version = tied ? 2 : 1;
    TempFile fm(tied ? "twin_m_t" : "twin_m"), ft(tied ? "twin_f_t" : "twin_f");
    write_synthetic_model(o, fm.path);
    write_unfolded_f32_twin(o, ft.path);
    GgufFile m = GgufFile::open(fm.path), t = GgufFile::open(ft.path);
    for (const auto& [key, v] : t.metadata()) EXPECT_NE(key.rfind("prism.", 0), 0u) << key;
    ASSERT_EQ(m.tensors().size(), t.tensors().size());
    for (size_t i = 0; i < m.tensors().size(); ++i) {
      const GgufTensor &a = m.tensors()[i], &b = t.tensors()[i];
      EXPECT_EQ(a.name, b.name);
      EXPECT_EQ(a.ne, b.ne);
      EXPECT_EQ(b.dtype, DType::F32) << b.name;
      if (a.dtype == DType::F32 || a.dtype == DType::BF16) {
        EXPECT_EQ(dequant_tensor(a), dequant_tensor(b)) << a.name;
      }
    }
    EXPECT_EQ(t.find_tensor("output.weight") == nullptr, tied);

    const uint32_t B = 256;
    const std::vector<double> h = dense_hadamard(B);
    const ModelConfig& c = o.config;
    for (const char* name : {"blk.0.attn_qkv.weight", "blk.0.ffn_down.weight", "blk.0.ssm_out.weight"}) {
      const GgufTensor& ws = m.tensor(name);
      const uint64_t k = ws.ne[0];
      const std::vector<double> x = random_vector(k, k + 17);
      std::vector<double> px = x;
      if (std::string(name) == "blk.0.ssm_out.weight") {
        // SPEC §3: tiled head r·n_k + k -> grouped head k·rep + r.
        const uint32_t hv = c.ssm_head_v_dim(), nk = c.ssm_n_k, rep = c.ssm_n_v / c.ssm_n_k;
        for (uint32_t r = 0; r < rep; ++r)
          for (uint32_t kh = 0; kh < nk; ++kh)
            for (uint32_t j = 0; j < hv; ++j) px[(kh * rep + r) * hv + j] = x[(r * nk + kh) * hv + j];
      }
      const std::vector<double> s = signs_for(m, k);
      for (uint64_t j = 0; j < k; ++j) px[j] *= s[j];
      const std::vector<double> y_folded = matvec(ws, apply_blocks(h, B, px));
      const std::vector<double> y_twin = matvec(t.tensor(name), x);
      double worst = 0, scale = 0;
      for (size_t r = 0; r < y_folded.size(); ++r) {
        worst = std::max(worst, std::fabs(y_folded[r] - y_twin[r]));
        scale = std::max(scale, std::fabs(y_folded[r]));
      }
      EXPECT_LT(worst, 1e-4) << name;
      EXPECT_GT(scale, 0.5) << name << ": outputs are O(1)";
    }
    // Embedding: twin row = s_E ⊙ blockH(z), z the stored row.
    const GgufTensor& ze = m.tensor("token_embd.weight");
    const std::vector<float> z = dequant_tensor(ze), e = dequant_tensor(t.tensor("token_embd.weight"));
    const uint64_t E = ze.ne[0];
    const std::vector<double> sE = signs_for(m, E);
    for (uint64_t row : {uint64_t{0}, uint64_t{1}, ze.ne[1] / 2, ze.ne[1] - 1}) {
      const std::vector<double> zr(z.begin() + row * E, z.begin() + (row + 1) * E);
      const std::vector<double> hz = apply_blocks(h, B, zr);
      for (uint64_t j = 0; j < E; ++j) ASSERT_NEAR(e[row * E + j], sE[j] * hz[j], 1e-6) << row << " " << j;
    }
  }
}

// ---- vocabulary ----------------------------------------------------------------------

// GPT-2 bytes_to_unicode, written out independently: the printable ranges map
// to themselves (and come first), the other 68 bytes to U+0100.. in byte order.
std::vector<std::pair<uint8_t, uint32_t>> gpt2_byte_order() {
  std::vector<std::pair<uint8_t, uint32_t>> v;
  auto printable = [](int b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  for (int b = 0; b < 256; ++b)
    if (printable(b)) v.emplace_back(static_cast<uint8_t>(b), b);
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b)
    if (!printable(b)) v.emplace_back(static_cast<uint8_t>(b), 256 + n++);
  return v;
}

std::string to_utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  s += static_cast<char>(0xC0 | (cp >> 6));
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

void check_vocab(const SynthVocab& v, uint32_t n) {
  ASSERT_EQ(v.tokens.size(), n);
  ASSERT_EQ(v.types.size(), n);
  std::unordered_set<std::string> seen(v.tokens.begin(), v.tokens.end());
  EXPECT_EQ(seen.size(), n) << "tokens must be unique";
  const auto order = gpt2_byte_order();
  for (size_t i = 0; i < 256; ++i) EXPECT_EQ(v.tokens[i], to_utf8(order[i].second)) << i;
  EXPECT_EQ(v.tokens[0], "!");
  EXPECT_EQ(v.tokens[188], "\xC4\x80");  // byte 0 -> U+0100, GPT-2 id 188
  // Specials at the end.
  EXPECT_EQ(v.tokens[n - 5], "<|endoftext|>");
  EXPECT_EQ(v.tokens[n - 4], "<|im_start|>");
  EXPECT_EQ(v.tokens[n - 3], "<|im_end|>");
  EXPECT_EQ(v.tokens[n - 2], "<think>");
  EXPECT_EQ(v.tokens[n - 1], "</think>");
  EXPECT_EQ(v.bos_id, n - 5);
  EXPECT_EQ(v.eos_id, n - 3);
  EXPECT_EQ(v.im_start_id, n - 4);
  EXPECT_EQ((std::vector<int32_t>(v.types.end() - 5, v.types.end())), (std::vector<int32_t>{3, 3, 3, 4, 4}));
  for (uint32_t i = 0; i < n - 5; ++i) ASSERT_EQ(v.types[i], 1) << i;
  EXPECT_EQ(256 + v.n_learned + v.n_filler + 5, n);
  // Merges: "a b" of two existing tokens whose concatenation exists; results
  // are never filler or special tokens.
  std::unordered_set<std::string> results;
  for (const std::string& m : v.merges) {
    const size_t sp = m.find(' ');
    ASSERT_NE(sp, std::string::npos) << m;
    ASSERT_EQ(m.find(' ', sp + 1), std::string::npos) << m;
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    EXPECT_TRUE(seen.count(a)) << m;
    EXPECT_TRUE(seen.count(b)) << m;
    EXPECT_TRUE(seen.count(a + b)) << m;
    results.insert(a + b);
  }
  for (uint32_t i = 256; i < 256 + v.n_learned; ++i) EXPECT_TRUE(results.count(v.tokens[i])) << v.tokens[i];
  for (uint32_t i = 256 + v.n_learned; i < n; ++i) EXPECT_FALSE(results.count(v.tokens[i])) << v.tokens[i];
  // Learned within qwen35 pre-tokens: a space (Ġ) only leads a token, except
  // in pure whitespace runs; digits are pre-tokens of their own.
  const std::string sp = "\xC4\xA0", nl = "\xC4\x8A", tab = "\xC4\x89";
  for (uint32_t i = 256; i < 256 + v.n_learned; ++i) {
    const std::string& t = v.tokens[i];
    const size_t at = t.find(sp, 1);
    if (at != std::string::npos) {
      std::string rest = t;
      for (const std::string& ws : {sp, nl, tab})
        for (size_t p; (p = rest.find(ws)) != std::string::npos;) rest.erase(p, ws.size());
      EXPECT_TRUE(rest.empty()) << t << ": a merge crossed a pre-token boundary";
    }
    EXPECT_EQ(std::count_if(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) > 1, false)
        << t;
  }
}

TEST(SynthVocab, SmallVocabIsAllLearned) {
  const SynthVocab v = build_synth_vocab(2048);
  check_vocab(v, 2048);
  EXPECT_EQ(v.n_filler, 0u) << "the built-in text should fill the small preset's vocab";
  EXPECT_GE(v.merges.size(), v.n_learned);
}

TEST(SynthVocab, Vocab27bIsFilledWithFillerTokens) {
  const SynthVocab v = build_synth_vocab(248320);
  check_vocab(v, 248320);
  EXPECT_GT(v.n_filler, 200000u);
  EXPECT_THROW(build_synth_vocab(260), Error);
  EXPECT_EQ(build_synth_vocab(261).tokens.size(), 261u);
}

TEST(SynthVocab, FileKeysAndTokenizerRoundTrip) {
  TempFile tmp("vocab");
  write_synthetic_model(tiny(), tmp.path);
  GgufFile f = GgufFile::open(tmp.path);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), "qwen35");
  EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").count, 1024u);
  EXPECT_EQ(f.get_array("tokenizer.ggml.token_type", GgufType::I32).count, 1024u);
  EXPECT_EQ(f.get("tokenizer.ggml.bos_token_id").type, GgufType::U32);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.bos_token_id"), 1019u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.padding_token_id"), 1019u);
  EXPECT_EQ(f.get_u32("tokenizer.ggml.eos_token_id"), 1021u);
  EXPECT_FALSE(f.get_bool("tokenizer.ggml.add_bos_token"));
  const std::string_view tpl = f.get_string("tokenizer.chat_template");
  EXPECT_NE(tpl.find("<|im_start|>"), std::string_view::npos);
  EXPECT_NE(tpl.find("<think>"), std::string_view::npos);
  EXPECT_NE(tpl.find("add_generation_prompt"), std::string_view::npos);

  auto tok = Tokenizer::from_gguf(f);
  const std::string text = "Good morning. How are you today? I'm fine, thanks: 42 apples and café.";
  const std::vector<int32_t> ids = tok->encode(text, false);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2) << "common words should be merged";
  const std::vector<int32_t> chat = tok->encode("<|im_start|>user\nHi<|im_end|>", true);
  ASSERT_GE(chat.size(), 3u);
  EXPECT_EQ(chat.front(), 1020);
  EXPECT_EQ(chat.back(), 1021);
}

// ---- CLI -----------------------------------------------------------------------------

int run_cli(const std::string& args, std::string* err) {
  TempFile log("cli_err");
  const std::string cmd = std::string(BONSAI_CLI) + " synth " + args + " >/dev/null 2>" + log.path;
  const int rc = std::system(cmd.c_str());
  std::ifstream f(log.path);
  err->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

TEST(SynthCli, BadValuesAreUsageErrorsNamingTheFlag) {
  TempFile out("cli_out");
  struct Case {
    std::string args, flag;
  };
  for (const Case& c :
       std::vector<Case>{{"--block 96", "--block"},
                         {"--block 512", "--block"},  // does not divide 256
                         {"--embd 200", "--embd"},
                         {"--type q4_0", "--type"},
                         {"--ab-type f64", "--ab-type"},
                         {"--heads 3 --kv-heads 2", "--heads"},
                         {"--rot 256", "--rot"},
                         {"--vocab 100", "--vocab"},
                         {"--tied --hadamard-version 1", "--tied"},
                         {"--preset huge", "--preset"},
                         {"--preset 27b --unfolded-f32 " + out.path + ".f32", "--unfolded-f32"}}) {
    std::string err;
    EXPECT_EQ(run_cli(c.args + " -o " + out.path, &err), 2) << c.args << ": " << err;
    EXPECT_NE(err.find(c.flag), std::string::npos) << c.args << ": " << err;
    EXPECT_FALSE(fs::exists(out.path)) << c.args << ": nothing is written on a usage error";
  }
  std::string err;
  EXPECT_EQ(run_cli("--preset tiny --no-vocab --vocab 100 --seed 3 -q -o " + out.path, &err), 0) << err;
  GgufFile f = GgufFile::open(out.path);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "no_vocab");
  EXPECT_EQ(f.tensor("token_embd.weight").ne[1], 100u);
}

}  // namespace
}  // namespace bonsai
