// The BONSAI_CUDA_* environment knobs, each parsed by one function here through runtime/env.h:
// unset or empty = the default, a set value must be exactly a valid one, else UsageError naming
// the variable, the value and what it accepts. These functions read the environment on every call
// and need no device; the kernels keep their own function-local caches (read once per process,
// at first use), which call them. check_knobs() reads every knob once: CudaBackend's constructor
// calls it, so a bad value fails there and never in the middle of a recorded step.
//
// Plain host declarations (no CUDA types beyond the kernel-choice enums): the .cu files include
// this header; the parsing itself lives in .cpp files (knobs.cpp, matvec_select.cpp,
// attention_select.cpp, gemm_select.cpp).
#pragma once

#include <optional>

#include "kernels/cuda/gemm.h"  // GemmKernel; launch.h's MatvecKernel, MatvecFixup

namespace bonsai::cuda {

// Every BONSAI_CUDA_* knob of the kernels and of CudaBackend, read now; throws on the first bad one.
void check_knobs();

namespace knob {

// matvec_select.cpp (launch.h: matvec_kernel, matvec_ws_variant, matvec_ws_loop, matvec_fixup)
std::optional<MatvecKernel> mv_kernel();  // BONSAI_CUDA_MV=ws|bulk|legacy; nullopt when unset
int mv_ws();                              // BONSAI_CUDA_MV_WS=0..31, default 8
int mv_loop();                            // BONSAI_CUDA_MV_LOOP=0|1, default 1
MatvecFixup mv_fixup();                   // BONSAI_CUDA_MV_FIXUP=last|first|slots, default last

// knobs.cpp (matvec.cu, matvec_config). The bounds are matvec_common.cuh's mv::kMaxRing and
// mv::kBlocksPerSm (static_assert there).
inline constexpr int kMvMaxRing = 8, kMvBlocksPerSm = 2;
int mv_ring();     // BONSAI_CUDA_MV_RING=1..kMvMaxRing, default 3
int mv_min();      // BONSAI_CUDA_MV_MIN=1..2^20, default 3
int mv_bps();      // BONSAI_CUDA_MV_BPS=1..kMvBlocksPerSm, default kMvBlocksPerSm
int mv_reserve();  // BONSAI_CUDA_MV_RESERVE=0..64, default 0

// attention_select.cpp (launch.h: attention_mode, attention_mma_forced_splits)
int attn();              // BONSAI_CUDA_ATTN=0..4, default 3
int attn_ring();         // BONSAI_CUDA_ATTN_RING=0|3|4|6, default 3 (attention_select.cpp)
int attn_splits();       // BONSAI_CUDA_ATTN_SPLITS=1..32; 0 when unset
int attn_dec_per();      // BONSAI_CUDA_ATTN_DEC_PER=1..2^20, default 64 (attention_decode_splits)
int attn_dec_max();      // BONSAI_CUDA_ATTN_DEC_MAX=32|64|128|256, default 256 (32: one split count)
int attn_score();        // BONSAI_CUDA_ATTN_SCORE=1|4, default 4 (attention_score_batch)
int attn_score_min();    // BONSAI_CUDA_ATTN_SCORE_MIN=1..2^30, default 16384 (attention_decode_batch)
bool attn_dec_mma();     // BONSAI_CUDA_ATTN_DEC_MMA=0|1, default 1 (attention_decode_mma_on)
int attn_dec_mma_min();  // BONSAI_CUDA_ATTN_DEC_MMA_MIN=1..2^30, default 1024 (attention_decode_mma_on)
bool attn_dec_wave();    // BONSAI_CUDA_ATTN_DEC_RULE=wave|double, default wave (attention_decode_splits)

// gemm_select.cpp (gemm.h: the functions of the same names without the knob:: prefix)
std::optional<GemmKernel> gemm_kernel();  // BONSAI_CUDA_GEMM=mma|wgmma|wgmma_cp|f16|auto; nullopt unset
int gemm_wg_min_blocks();
int gemm_f16_terms();
int gemm_f16_pipe();
int gemm_f16_decode();
int gemm_f16_tail_gain();
int gemm_f16_stream();
int gemm_f16_sums();
int gemm_f16_tokens();
int gemm_f16_stages();
int gemm_f16_persist();
int gemm_wg_swizzle();
int gemm_wg_loop();
int gemm_wg_tokens();
int gemm_stage();
int gemm_wg_stages();

// knobs.cpp (gemm.cu)
int gemm_split();      // BONSAI_CUDA_GEMM_SPLIT=-1..65536, default 1 (plan_gemm)
bool gemm_mbarrier();  // BONSAI_CUDA_GEMM_PIPE=mb|bar, default mb (true)
int gemm_occupancy();  // BONSAI_CUDA_GEMM_OCC=1|2, default 2
bool gemm_wg_sw();     // BONSAI_CUDA_GEMM_WG_SW=0|1, default 1

// knobs.cpp (the other .cu files)
int res_split();       // BONSAI_CUDA_RES_SPLIT=0..3, default 3 (norm_fwht.cu)
bool gdn_ab_mma();     // BONSAI_CUDA_GDN_AB=mma|simt, default mma (gdn_ab_mma.cu)
int gdn_ab_variant();  // BONSAI_CUDA_GDN_AB_VARIANT=0..kGdnAbMmaVariants-1 (gdn_ab_mma.cu)
bool pdl();            // BONSAI_CUDA_PDL=0|1, default 1 (elementwise.cu; on only from sm_90)
bool gdn_early();      // BONSAI_CUDA_GDN_EARLY=0|1, default 1 (gdn.cu, gdn_decode_config)
int walk();            // BONSAI_CUDA_WALK=0|1|2|6; -1 when unset (gdn_walk.cu)
int gdn_pipe();        // BONSAI_CUDA_GDN_PIPE=0..3, default kGdnPipeDefault (gdn_pipe.cu)

}  // namespace knob
}  // namespace bonsai::cuda
