// Value generators of the synthetic model: ternary rows, small float
// tensors, Hadamard signs. Each is a pure function of (seed, tensor name[, row]).
#include <algorithm>
#include <cstring>
#include <exception>
#include <thread>

#include "bonsai/error.h"
#include "synth/synth_internal.h"

namespace bonsai::synth {
namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// A random byte r maps to code (r >= 79) + (r >= 177): P = 79/256, 98/256,
// 79/256 = 30.9 / 38.3 / 30.9 % for -1 / 0 / +1, so E[c^2] = 158/256 = 0.617.
constexpr uint8_t kCodeLo = 79, kCodeHi = 177;

}  // namespace

void ternary_row(DType t, uint64_t tensor_key, uint64_t row, int64_t k, RowScratch& s, uint8_t* dst) {
  Rng rng(mix64(tensor_key ^ (row * 0xd1b54a32d192ed03ull)));
  const float d0 = ternary_base_scale(static_cast<uint64_t>(k));
  const int64_t n_scale = k / kScaleGroup;
  // Scales first, then codes: the stream layout does not depend on the format,
  // so PQ2_0, PTQ1_0 and both Q2_0 layouts hold the same values.
  const int per = t == DType::Q2_0_G64 ? 2 : 1;  // g64: each 128-block scale twice
  for (int64_t b = 0; b < n_scale; ++b) {
    const float d = d0 * static_cast<float>(1.0 + 0.3 * (2.0 * rng.uniform() - 1.0));
    for (int i = 0; i < per; ++i) s.scales[b * per + i] = d;
  }
  uint8_t* c = s.codes.data();
  for (int64_t i = 0; i < k; i += 8) {
    const uint64_t w = rng.next();
    std::memcpy(c + i, &w, 8);  // k is a multiple of 128
  }
  for (int64_t i = 0; i < k; ++i) c[i] = static_cast<uint8_t>((c[i] >= kCodeLo) + (c[i] >= kCodeHi));
  if (t == DType::PTQ1_0) {
    encode_ternary_row(t, c, s.scales.data(), dst, k);
    return;
  }
  // 2-bit layouts (PQ2_0, Q2_0 g128/g64): {fp16 d, qs[g/4]} per group; code j
  // of a group at bits 2(j%4) of qs[j/4]. Same bytes as encode_ternary_row,
  // 8 codes per step: with code i (< 4) in byte i of a 32-bit word w, the
  // packed byte is (w | w>>6 | w>>12 | w>>18) & 0xFF (byte i lands at bit 2i;
  // everything else lands above bit 7). tests/test_synth.cpp checks it.
  const int64_t g = dtype_info(t).block_size;
  for (int64_t b = 0; b < k / g; ++b, dst += 2 + g / 4) {
    const uint16_t d = f32_to_fp16(s.scales[b]);
    std::memcpy(dst, &d, 2);
    const uint8_t* cb = c + b * g;
    for (int64_t j = 0; j < g; j += 8) {
      uint64_t w;
      std::memcpy(&w, cb + j, 8);
      const uint64_t x = w | (w >> 6) | (w >> 12) | (w >> 18);
      dst[2 + j / 4] = static_cast<uint8_t>(x);
      dst[2 + j / 4 + 1] = static_cast<uint8_t>(x >> 32);
    }
  }
}

DType storage_type(const TensorSpec& spec, const SynthOptions& o) {
  switch (spec.role) {
    case TensorRole::Folded:
    case TensorRole::Embedding:
      return o.weight_type;
    case TensorRole::SsmAB:
      return o.ab_type;
    case TensorRole::Norm:
    case TensorRole::SsmParam:
      return DType::F32;
  }
  return DType::F32;
}

std::vector<float> float_tensor_values(const TensorSpec& spec, uint64_t seed, DType storage) {
  uint64_t n = 1;
  for (uint64_t d : spec.ne) n *= d;
  std::vector<float> v(n);
  Rng rng(stream_key(seed, spec.name));
  const std::string_view name = spec.name;
  if (spec.role == TensorRole::Norm) {
    for (auto& x : v) x = static_cast<float>(1.0 + 0.1 * rng.normal());  // gains stored as used (+1 applied)
  } else if (ends_with(name, ".ssm_a")) {
    for (auto& x : v)
      x = static_cast<float>(-std::exp(2.5 * rng.uniform()));  // -exp(A_log), A_log ~ U[0, 2.5]
  } else if (ends_with(name, ".ssm_dt.bias")) {
    for (auto& x : v) x = static_cast<float>(0.1 * rng.normal());
  } else if (ends_with(name, ".ssm_conv1d.weight")) {
    for (auto& x : v) x = static_cast<float>(0.3 * rng.normal());
  } else if (spec.role == TensorRole::SsmAB) {
    // {E, n_v}: a ~ N(0, 1) for a unit-RMS normed input.
    const double sd = 1.0 / std::sqrt(static_cast<double>(spec.ne[0]));
    for (auto& x : v) x = static_cast<float>(sd * rng.normal());
  } else {
    fail("synth: no float generator for tensor '{}'", spec.name);
  }
  // Round to the storage type so the F32 twin holds exactly the stored values.
  if (storage == DType::F16)
    for (auto& x : v) x = fp16_to_f32(f32_to_fp16(x));
  else if (storage == DType::BF16)
    for (auto& x : v) x = bf16_to_f32(f32_to_bf16(x));
  return v;
}

std::vector<uint8_t> encode_floats(DType t, const std::vector<float>& v) {
  std::vector<uint8_t> out;
  if (t == DType::F32) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  out.resize(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = t == DType::F16 ? f32_to_fp16(v[i]) : f32_to_bf16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

std::vector<int32_t> hadamard_signs(const SynthOptions& o) {
  std::vector<int32_t> s;
  for (uint32_t w : folded_input_widths(o.config)) {
    Rng rng(stream_key(o.seed, "prism.hadamard.sign_values", w));
    for (uint32_t i = 0; i < w; ++i) s.push_back((rng.next() >> 63) ? 1 : -1);
  }
  return s;
}

int worker_count() {
  const unsigned hc = std::thread::hardware_concurrency();
  return static_cast<int>(std::clamp(hc, 1u, 8u));
}

void parallel_rows(int64_t n, int n_workers, const std::function<void(int64_t, int64_t, int)>& fn) {
  n_workers = static_cast<int>(std::clamp<int64_t>(n_workers, 1, std::max<int64_t>(n, 1)));
  if (n_workers == 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t per = (n + n_workers - 1) / n_workers;
  std::vector<std::exception_ptr> errors(n_workers);
  std::vector<std::thread> threads;
  for (int w = 1; w < n_workers; ++w) {
    const int64_t r0 = std::min(n, w * per), r1 = std::min(n, r0 + per);
    threads.emplace_back([&, r0, r1, w] {
      try {
        fn(r0, r1, w);
      } catch (...) {
        errors[w] = std::current_exception();
      }
    });
  }
  try {
    fn(0, std::min(n, per), 0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace bonsai::synth
