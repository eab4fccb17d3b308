// BONSAI_CUDA_MV: which kernel runs the ternary matvec (kernels/cuda/launch.h, matvec_kernel);
// BONSAI_CUDA_MV_WS: the ws kernel's protocol variant (matvec_ws_variant); BONSAI_CUDA_MV_LOOP: its
// consumer loop (matvec_ws_loop); BONSAI_CUDA_MV_FIXUP:
// the split fix-up of the bulk and ws kernels (matvec_fixup). The knob:: functions parse
// (kernels/cuda/knobs.h); the others cache their result once per process.
#include "bonsai/error.h"
#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"
#include "runtime/env.h"

namespace bonsai::cuda {

std::optional<MatvecKernel> knob::mv_kernel() {
  if (env_value("BONSAI_CUDA_MV").empty()) return std::nullopt;
  return env_choice<MatvecKernel>(
      "BONSAI_CUDA_MV",
      {{"ws", MatvecKernel::ws}, {"bulk", MatvecKernel::bulk}, {"legacy", MatvecKernel::legacy}},
      MatvecKernel::legacy);
}

MatvecKernel matvec_kernel() {
  static const MatvecKernel choice = [] {
    const std::optional<MatvecKernel> k = knob::mv_kernel();
    if (!k) {
      // Default ws where the device has it: bit-identical to bulk, tg128 +1 % on the H200
      // (docs/performance.md, "Warp-specialized matvec").
      return matvec_kernel_available(MatvecKernel::ws) ? MatvecKernel::ws : MatvecKernel::legacy;
    }
    if (!matvec_kernel_available(*k))
      fail("BONSAI_CUDA_MV={}: the device has no sm_90 code for this kernel (compute capability 9.x needed)",
           env_value("BONSAI_CUDA_MV"));
    return *k;
  }();
  return choice;
}

// Default two producer warps: the large matvecs 10-25 % faster than with one, the same end to
// end (docs/performance.md, "Warp-specialized matvec"). A bit mask (launch.h).
int knob::mv_ws() { return env_int("BONSAI_CUDA_MV_WS", 8, 0, 31); }

int matvec_ws_variant() {
  static const int variant = knob::mv_ws();
  return variant;
}

// Default 1: the consumer loop with the shorter decode and ring bookkeeping, bit-identical
// (docs/performance.md, "the ws matvec's consumer loop").
int knob::mv_loop() { return env_flag("BONSAI_CUDA_MV_LOOP", true) ? 1 : 0; }

int matvec_ws_loop() {
  static const int loop = knob::mv_loop();
  return loop;
}

// Default last (since session 9; first before): the three are bit-identical (docs/performance.md,
// "Split-K fix-up"). Where a decode step still fixes up in the kernel (the GDN qkv+z and the head;
// the other matvecs defer their sums to the next site), last measured +0.35 % tg128 over first
// and slots -2 % ("Session 9: decode timeline through CUPTI, ..."), and last needs no
// all-blocks-resident launch (first_sums_safe).
MatvecFixup knob::mv_fixup() {
  return env_choice<MatvecFixup>(
      "BONSAI_CUDA_MV_FIXUP",
      {{"last", MatvecFixup::last}, {"first", MatvecFixup::first}, {"slots", MatvecFixup::slots}},
      MatvecFixup::last);
}

MatvecFixup matvec_fixup() {
  static const MatvecFixup fixup = knob::mv_fixup();
  return fixup;
}

}  // namespace bonsai::cuda
