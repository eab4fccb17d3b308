// BONSAI_CUDA_ATTN: which kernel runs the attention (kernels/cuda/launch.h, attention_mode);
// BONSAI_CUDA_ATTN_SPLITS: the tensor-core prefill kernel's split count (attention_mma_forced_splits).
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {

int attention_mode() {
  static const int mode = [] {
    const char* e = std::getenv("BONSAI_CUDA_ATTN");
    const std::string_view v = e ? e : "";
    // Default 3: prefill batches on the tensor cores (docs/performance.md, "The prefill attention").
    if (v.empty()) return 3;
    if (v.size() == 1 && v[0] >= '0' && v[0] <= '4') return v[0] - '0';
    fail(
        "BONSAI_CUDA_ATTN: '{}' is not an attention kernel (0, 1, 2: the fp32 split kernel's variants; 3, 4: "
        "prefill batches on the tensor cores with KV tiles of 64 / 32 positions)",
        v);
  }();
  return mode;
}

int attention_mma_forced_splits() {
  static const int splits = [] {
    const char* e = std::getenv("BONSAI_CUDA_ATTN_SPLITS");
    const std::string_view v = e ? e : "";
    if (v.empty()) return 0;
    int n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > 32)
      fail("BONSAI_CUDA_ATTN_SPLITS: '{}' is not a split count (1..32)", v);
    return n;
  }();
  return splits;
}

}  // namespace bonsai::cuda
