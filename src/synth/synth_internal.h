// Internals of the synthetic model writer: the deterministic RNG streams and
// the per-tensor value generators shared by the folded file and its F32 twin.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "bonsai/config.h"
#include "bonsai/formats.h"
#include "bonsai/synth.h"

namespace bonsai::synth {

inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// splitmix64's finalizer as a pure function: a bijective mix of x.
inline uint64_t mix64(uint64_t x) {
  uint64_t s = x;
  return splitmix64(s);
}

inline uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// Key of the stream for (seed, name, sub): sub is the row of a matrix (0 for
// a whole small tensor). Mixed through splitmix64 so neighbouring rows and
// seeds give unrelated streams.
// (Rng seeds its state by stepping splitmix64 from the key, so keys must be
// unrelated, not merely distinct: keys one golden-ratio step apart would give
// overlapping states.)
inline uint64_t stream_key(uint64_t seed, std::string_view name, uint64_t sub = 0) {
  return mix64(mix64(seed ^ fnv1a64(name)) ^ (sub * 0xd1b54a32d192ed03ull));
}

// xoshiro256++ (Blackman & Vigna): fast, 64 random bits per call.
class Rng {
 public:
  explicit Rng(uint64_t key) {
    for (auto& w : s_) w = splitmix64(key);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[0] + s_[3], 23) + s_[0];
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  // Standard normal by Box-Muller (one value per call, no cached state).
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

// Ternary weights: one scale per 128 inputs (also for Q2_0 g64, whose two
// 64-groups repeat it), base 1/sqrt(0.62 K).
inline constexpr int64_t kScaleGroup = 128;
inline float ternary_base_scale(uint64_t k) {
  return static_cast<float>(1.0 / std::sqrt(0.62 * static_cast<double>(k)));
}

// Scratch for one worker generating ternary rows of width <= k.
struct RowScratch {
  std::vector<uint8_t> codes;   // [k]
  std::vector<float> scales;    // [k / 64] (format groups)
  std::vector<float> values;    // [k] dequantized row (twin only)
  std::vector<float> rotated;   // [k] unfolded row (twin only)
  std::vector<uint8_t> stored;  // [k] >= row_bytes of any ternary format (twin only)
  explicit RowScratch(int64_t k) : codes(k), scales(k / 64), values(k), rotated(k), stored(k) {}
};

// Writes stored row `row` (row_bytes(t, k) bytes) of the ternary tensor whose
// stream key is `tensor_key` (stream_key(seed, name)).
void ternary_row(DType t, uint64_t tensor_key, uint64_t row, int64_t k, RowScratch& s, uint8_t* dst);

// The storage type of a tensor in the folded file.
DType storage_type(const TensorSpec& spec, const SynthOptions& o);

// Values of a small float tensor (norms, ssm params, alpha/beta), already
// rounded to `storage` (exact when widened back to F32).
std::vector<float> float_tensor_values(const TensorSpec& spec, uint64_t seed, DType storage);

// Encodes F32 values as F32 / F16 / BF16 bytes.
std::vector<uint8_t> encode_floats(DType t, const std::vector<float>& v);

// The ±1 signs of every folded input width, concatenated in ascending width
// order (prism.hadamard.sign_values).
std::vector<int32_t> hadamard_signs(const SynthOptions& o);

// Runs fn(r0, r1, worker) over [0, n) split into contiguous ranges on up to
// n_workers threads (worker 0 is the caller). Rethrows the first exception.
void parallel_rows(int64_t n, int n_workers, const std::function<void(int64_t, int64_t, int)>& fn);
int worker_count();

}  // namespace bonsai::synth
