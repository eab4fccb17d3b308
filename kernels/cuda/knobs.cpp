// The BONSAI_CUDA_* knobs of the .cu files (kernels/cuda/knobs.h) and of CudaBackend's
// constructor (cuda_backend_impl.h, BackendKnobs), and check_knobs. Parsed here, in host C++,
// so that the .cu files only call these; each default is the value the knob had before it went
// through runtime/env.h, and each range is the one its site accepted (or clamped to).
#include "kernels/cuda/knobs.h"

#include <string>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/gdn_ab_mma.h"
#include "kernels/cuda/gdn_decode.h"
#include "kernels/cuda/gdn_pipe.h"
#include "runtime/env.h"

namespace bonsai::cuda {

// matvec.cu, matvec_config (the comment there says what each does).
int knob::mv_ring() { return env_int("BONSAI_CUDA_MV_RING", 3, 1, kMvMaxRing); }
int knob::mv_min() { return env_int("BONSAI_CUDA_MV_MIN", 3, 1, 1 << 20); }
int knob::mv_bps() { return env_int("BONSAI_CUDA_MV_BPS", kMvBlocksPerSm, 1, kMvBlocksPerSm); }
int knob::mv_reserve() { return env_int("BONSAI_CUDA_MV_RESERVE", 0, 0, 64); }

// gemm.cu. BONSAI_CUDA_GEMM_SPLIT (plan_gemm): 1 the model, 0 the former rule, n > 1 n ranges
// (at most what k allows), -1 one range; measurements only.
int knob::gemm_split() { return env_int("BONSAI_CUDA_GEMM_SPLIT", 1, -1, 1 << 16); }
bool knob::gemm_mbarrier() {
  return env_choice<bool>("BONSAI_CUDA_GEMM_PIPE", {{"mb", true}, {"bar", false}}, true);
}
int knob::gemm_occupancy() { return env_int_in("BONSAI_CUDA_GEMM_OCC", 2, {1, 2}); }
bool knob::gemm_wg_sw() { return env_flag("BONSAI_CUDA_GEMM_WG_SW", true); }

// The other .cu files: norm_fwht.cu, gdn_ab_mma.cu, elementwise.cu, gdn.cu, gdn_walk.cu,
// gdn_pipe.cu (each value's meaning is documented at its use and in the headers).
int knob::res_split() { return env_int("BONSAI_CUDA_RES_SPLIT", 3, 0, 3); }
bool knob::gdn_ab_mma() {
  return env_choice<bool>("BONSAI_CUDA_GDN_AB", {{"mma", true}, {"simt", false}}, true);
}
int knob::gdn_ab_variant() {
  return env_int("BONSAI_CUDA_GDN_AB_VARIANT", kGdnAbMmaDefaultVariant, 0, kGdnAbMmaVariants - 1);
}
bool knob::pdl() { return env_flag("BONSAI_CUDA_PDL", true); }
bool knob::gdn_early() { return env_flag("BONSAI_CUDA_GDN_EARLY", true); }
int knob::walk() { return env_int_in("BONSAI_CUDA_WALK", -1, {0, 1, 2, 6}); }
int knob::gdn_pipe() { return env_int("BONSAI_CUDA_GDN_PIPE", kGdnPipeDefault, 0, 3); }

// gdn_decode.h documents each knob. Read afresh on every call (each CudaBackend reads it once).
GdnDecodeConfig gdn_decode_config() {
  GdnDecodeConfig c;
  c.on = env_flag("BONSAI_CUDA_GDN_DEC", true);
  c.cluster = env_int_in("BONSAI_CUDA_GDN_DEC_CLUSTER", kGdnDecCluster, {1, 2, 4});
  c.ab_early = env_flag("BONSAI_CUDA_GDN_DEC_AB", kGdnDecAbEarly);
  c.membar_free = env_flag("BONSAI_CUDA_GDN_DEC_MEMBAR", kGdnDecMembarFree);
  c.count_early = env_flag("BONSAI_CUDA_GDN_DEC_COUNT", kGdnDecCountEarly);
  c.split_weak = env_flag("BONSAI_CUDA_QKV_LOAD", kSplitWeakLoads);
  c.fwht = env_flag("BONSAI_CUDA_GDN_FWHT", kGdnDecFwht);
  c.fwht_poll = env_flag("BONSAI_CUDA_GDN_FWHT_POLL", kGdnDecFwhtPoll);
  c.early = knob::gdn_early();
  c.push = env_flag("BONSAI_CUDA_GDN_DEC_PUSH", kGdnDecPush);
  return c;
}

}  // namespace bonsai::cuda

namespace bonsai::cuda_detail {

namespace {
// A knob of two comma-separated integers ("a,b"), each one for which ok() holds; `pair` when
// unset or empty.
template <class Ok>
void env_pair(const char* name, int (&pair)[2], Ok ok, std::string_view expected) {
  const std::string_view v = env_value(name);
  if (v.empty()) return;
  const size_t comma = v.find(',');
  int a = 0, b = 0;
  if (comma == std::string_view::npos || !parse_decimal(v.substr(0, comma), a) ||
      !parse_decimal(v.substr(comma + 1), b) || !ok(a) || !ok(b))
    env_refuse(name, v, expected);
  pair[0] = a;
  pair[1] = b;
}
}  // namespace

BackendKnobs read_backend_knobs() {
  BackendKnobs k;
  k.mv_evict = env_flag("BONSAI_CUDA_MV_EVICT", k.mv_evict);
  k.gdn_stream = env_flag("BONSAI_CUDA_GDN_STREAM", k.gdn_stream);
  k.gdn_dec = cuda::gdn_decode_config();
  k.mv_defer = env_int("BONSAI_CUDA_MV_DEFER", k.mv_defer, 0, 2);
  k.site_f16_mode = env_int("BONSAI_CUDA_SITE_F16", k.site_f16_mode, 0, 4);
  k.site_skip_quant = env_flag("BONSAI_CUDA_SITE_SKIPQ", k.site_skip_quant);
  k.ffn_defer = env_flag("BONSAI_CUDA_FFN_DEFER", k.ffn_defer);
  // 0: fwht_split_kernel; 1, 2, 4: the lean site's blocks per Hadamard block
  k.swi_site = env_int_in("BONSAI_CUDA_SWI_SITE", k.swi_site, {0, 1, 2, 4});
  k.attn_fwht = env_flag("BONSAI_CUDA_ATTN_FWHT", k.attn_fwht);
  k.swi_low_regs = env_flag("BONSAI_CUDA_SWI_REGS", k.swi_low_regs);
  k.qkv_defer = env_int("BONSAI_CUDA_QKV_DEFER", k.qkv_defer, 0, 3);
  env_pair(
      "BONSAI_CUDA_FWHT_CLUSTER", k.fwht_ctas, [](int c) { return c == 1 || c == 2 || c == 4 || c == 8; },
      "swiglu,plain with each one of 1, 2, 4, 8 (e.g. 4,1)");
  env_pair(
      "BONSAI_CUDA_SITE_CLUSTER", k.site_cluster, [](int c) { return c >= 0 && c <= 4; },
      "narrow,wide with each an integer in 0 .. 4 (e.g. 0,3)");
  static constexpr const char* kUnitsVar[BackendKnobs::kMvLaunches] = {nullptr,
                                                                       "BONSAI_CUDA_MV_UNITS_GDN",
                                                                       "BONSAI_CUDA_MV_UNITS_ATTN",
                                                                       "BONSAI_CUDA_MV_UNITS_GATEUP",
                                                                       "BONSAI_CUDA_MV_UNITS_DOWN",
                                                                       "BONSAI_CUDA_MV_UNITS_OUT",
                                                                       "BONSAI_CUDA_MV_UNITS_HEAD"};
  // 0: no hint (the global plan); n: at least n units per warp
  for (int i = 1; i < BackendKnobs::kMvLaunches; ++i) k.mv_units[i] = env_int(kUnitsVar[i], -1, 0, 65536);
  return k;
}

}  // namespace bonsai::cuda_detail

namespace bonsai::cuda {

void check_knobs() {
  (void)cuda_detail::read_backend_knobs();  // includes gdn_decode_config
  (void)knob::mv_kernel();
  (void)knob::mv_ws();
  (void)knob::mv_loop();
  (void)knob::mv_fixup();
  (void)knob::mv_ring();
  (void)knob::mv_min();
  (void)knob::mv_bps();
  (void)knob::mv_reserve();
  (void)knob::attn();
  (void)knob::attn_dec_per();
  (void)knob::attn_dec_max();
  (void)knob::attn_dec_wave();
  (void)knob::attn_score();
  (void)knob::attn_score_min();
  (void)knob::attn_dec_mma();
  (void)knob::attn_dec_mma_min();
  (void)knob::attn_splits();
  (void)knob::gemm_kernel();
  (void)knob::gemm_wg_min_blocks();
  (void)knob::gemm_f16_terms();
  (void)knob::gemm_f16_pipe();
  (void)knob::gemm_f16_decode();
  (void)knob::gemm_f16_tail_gain();
  (void)knob::gemm_f16_stream();
  (void)knob::gemm_f16_sums();
  (void)knob::gemm_f16_tokens();
  (void)knob::gemm_f16_stages();
  (void)knob::gemm_f16_persist();
  (void)knob::gemm_wg_swizzle();
  (void)knob::gemm_wg_loop();
  (void)knob::gemm_wg_tokens();  // also _WG_STAGES and _WG_SWIZZLE, and that they fit together
  (void)knob::gemm_stage();
  (void)knob::gemm_wg_stages();
  (void)knob::gemm_split();
  (void)knob::gemm_mbarrier();
  (void)knob::gemm_occupancy();
  (void)knob::gemm_wg_sw();
  (void)knob::res_split();
  (void)knob::gdn_ab_mma();
  (void)knob::gdn_ab_variant();
  (void)knob::pdl();
  (void)knob::walk();
  (void)knob::gdn_pipe();
}

}  // namespace bonsai::cuda
