// The production matvec's run-time selection (kernels/cuda/matvec_select.cpp, knobs.cpp,
// elementwise.cu) for the standalone probes that link kernels/cuda/matvec.cu without the
// library (persistent_probe.cu, consumer_probe.cu): the ws kernel (PK_MV=bulk for the bulk one),
// its default protocol (two producer warps) and consumer loop, the first-rank split fix-up
// (PK_FIXUP=last|slots for the others), PDL on, and matvec_config's plan knobs read from the same
// variables as production's (BONSAI_CUDA_MV_RING / _MIN / _BPS / _RESERVE, production's defaults;
// not range-checked here). Include once per probe, in one translation unit.
#pragma once

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/knobs.h"
#include "kernels/cuda/launch.h"

namespace bonsai::cuda {
MatvecKernel matvec_kernel() {
  const char* e = std::getenv("PK_MV");
  return e && std::strcmp(e, "bulk") == 0 ? MatvecKernel::bulk : MatvecKernel::ws;
}
int matvec_ws_variant() { return 8; }
int matvec_ws_loop() { return 1; }
MatvecFixup matvec_fixup() {
  const char* e = std::getenv("PK_FIXUP");
  if (e && std::strcmp(e, "last") == 0) return MatvecFixup::last;
  if (e && std::strcmp(e, "slots") == 0) return MatvecFixup::slots;
  return MatvecFixup::first;
}
bool pdl_enabled() { return true; }

namespace knob {
namespace probe_detail {
inline int env_or(const char* name, int dflt) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : dflt;
}
}  // namespace probe_detail
int mv_ring() { return probe_detail::env_or("BONSAI_CUDA_MV_RING", 3); }
int mv_min() { return probe_detail::env_or("BONSAI_CUDA_MV_MIN", 3); }
int mv_bps() { return probe_detail::env_or("BONSAI_CUDA_MV_BPS", kMvBlocksPerSm); }
int mv_reserve() { return probe_detail::env_or("BONSAI_CUDA_MV_RESERVE", 0); }
}  // namespace knob
}  // namespace bonsai::cuda
