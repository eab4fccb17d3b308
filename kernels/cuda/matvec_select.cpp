// BONSAI_CUDA_MV: which kernel runs the ternary matvec (kernels/cuda/launch.h, matvec_kernel);
// BONSAI_CUDA_MV_WS: the ws kernel's protocol variant (matvec_ws_variant); BONSAI_CUDA_MV_LOOP: its
// consumer loop (matvec_ws_loop); BONSAI_CUDA_MV_FIXUP:
// the split fix-up of the bulk and ws kernels (matvec_fixup).
#include <charconv>
#include <cstdlib>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {

MatvecKernel matvec_kernel() {
  static const MatvecKernel choice = [] {
    const char* e = std::getenv("BONSAI_CUDA_MV");
    const std::string_view v = e ? e : "";
    MatvecKernel k = MatvecKernel::legacy;
    if (v.empty()) {
      // Default ws where the device has it: bit-identical to bulk, tg128 +1 % on the H200
      // (docs/performance.md, "Warp-specialized matvec").
      return matvec_kernel_available(MatvecKernel::ws) ? MatvecKernel::ws : MatvecKernel::legacy;
    }
    if (v == "ws")
      k = MatvecKernel::ws;
    else if (v == "bulk")
      k = MatvecKernel::bulk;
    else if (v != "legacy")
      fail("BONSAI_CUDA_MV: '{}' is not a matvec kernel (ws, bulk or legacy)", v);
    if (!matvec_kernel_available(k))
      fail("BONSAI_CUDA_MV={}: the device has no sm_90 code for this kernel (compute capability 9.x needed)",
           v);
    return k;
  }();
  return choice;
}

int matvec_ws_variant() {
  static const int variant = [] {
    const char* e = std::getenv("BONSAI_CUDA_MV_WS");
    const std::string_view v = e ? e : "";
    // Default two producer warps: the large matvecs 10-25 % faster than with one, the same
    // end to end (docs/performance.md, "Warp-specialized matvec").
    if (v.empty()) return 8;
    int n = -1;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 0 || n > 31)
      fail("BONSAI_CUDA_MV_WS: '{}' is not a ws matvec variant (a bit mask 0..31)", v);
    return n;
  }();
  return variant;
}

int matvec_ws_loop() {
  static const int loop = [] {
    const char* e = std::getenv("BONSAI_CUDA_MV_LOOP");
    const std::string_view v = e ? e : "";
    // Default 1: the consumer loop with the shorter decode and ring bookkeeping, bit-identical
    // (docs/performance.md, "the ws matvec's consumer loop").
    if (v.empty() || v == "1") return 1;
    if (v != "0") fail("BONSAI_CUDA_MV_LOOP: '{}' is not a ws matvec consumer loop (0 or 1)", v);
    return 0;
  }();
  return loop;
}

MatvecFixup matvec_fixup() {
  static const MatvecFixup fixup = [] {
    const char* e = std::getenv("BONSAI_CUDA_MV_FIXUP");
    const std::string_view v = e ? e : "";
    // Default last (since session 9; first before): the three are bit-identical (docs/performance.md,
    // "Split-K fix-up"). Where a decode step still fixes up in the kernel (the GDN qkv+z and the head;
    // the other matvecs defer their sums to the next site), last measured +0.35 % tg128 over first
    // and slots -2 % ("Session 9: decode timeline through CUPTI, ..."), and last needs no
    // all-blocks-resident launch (first_sums_safe).
    if (v.empty() || v == "last") return MatvecFixup::last;
    if (v == "slots") return MatvecFixup::slots;
    if (v != "first") fail("BONSAI_CUDA_MV_FIXUP: '{}' is not a split fix-up (first, last or slots)", v);
    return MatvecFixup::first;
  }();
  return fixup;
}

}  // namespace bonsai::cuda
