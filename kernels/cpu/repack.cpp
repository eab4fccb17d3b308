#include "kernels/cpu/repack.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/formats.h"
#include "kernels/cpu/matvec.h"
#include "runtime/env.h"

namespace bonsai::cpu {

HugeBuffer::HugeBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  // Start on a 2 MiB boundary so every whole 2 MiB of the buffer can be one
  // huge page (the kernel aligns only mappings whose length is a multiple of
  // 2 MiB; a 3 MiB GDN state would otherwise get at most one): map 2 MiB
  // more, keep the aligned part, unmap the rest.
  constexpr size_t kHuge = size_t{2} << 20, kPage = 4096;
  const size_t len = (bytes + kPage - 1) / kPage * kPage;
  void* raw = mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    fail("cannot map {} bytes ({:.2f} GB) of anonymous memory", bytes, static_cast<double>(bytes) / 1e9);
  auto* r = static_cast<uint8_t*>(raw);
  auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(r) + kHuge - 1) & ~uintptr_t{kHuge - 1});
  if (p > r) munmap(r, static_cast<size_t>(p - r));
  if (r + len + kHuge > p + len) munmap(p + len, static_cast<size_t>(r + len + kHuge - (p + len)));
  p_ = p;
  // Advice only: without THP (or with it off) this fails harmlessly.
  (void)madvise(p_, len, MADV_HUGEPAGE);
}

HugeBuffer::~HugeBuffer() {
  if (p_) munmap(p_, (n_ + 4095) / 4096 * 4096);
}

RepackPolicy repack_policy_from_env() {
  RepackPolicy p;
  p.ptq1_transcode =
      env_choice<bool>("BONSAI_CPU_PTQ1", {{"direct", false}, {"transcode", true}}, p.ptq1_transcode);
  p.weights = env_choice<WeightsMode>("BONSAI_CPU_WEIGHTS",
                                      {{"stream", WeightsMode::Stream},
                                       {"lanes", WeightsMode::Lanes},
                                       {"map", WeightsMode::Map},
                                       {"copy", WeightsMode::Copy}},
                                      p.weights);
  return p;
}

namespace {
// Lanes16 repack of a PQ2_0 / Q2_0 g128 weight, or of a PTQ1_0 one through
// the bit-exact transcode (a few rows at a time into a per-task buffer).
std::unique_ptr<Repack> make_lanes(const Weight& w, ThreadPool& pool, bool stream) {
  const bool ptq1 = w.type == DType::PTQ1_0;
  const DType type = ptq1 ? DType::PQ2_0 : w.type;
  const WeightLayout layout = stream ? WeightLayout::Stream16 : WeightLayout::Lanes16;
  const int64_t total = stream ? stream_total_bytes(w.n, w.k) : lanes_total_bytes(w.n, w.k);
  auto rp = std::make_unique<Repack>(type, static_cast<size_t>(total), layout);
  uint8_t* dst = rp->bytes.data();
  const WeightView src = view_of(w);
  const int64_t nb = w.k / 128, code_rb = lanes_code_row_bytes(w.k);
  const int64_t pq2_rb = static_cast<int64_t>(row_bytes(DType::PQ2_0, static_cast<uint64_t>(w.k)));
  constexpr int64_t kTaskBytes = int64_t{2} << 20;         // ~one huge page of output per task
  const int64_t rl = stream ? stream_group_rows(w.k) : 1;  // tasks hold whole Stream16 row groups
  const int64_t rows = std::max<int64_t>(1, kTaskBytes / code_rb / rl) * rl;
  uint8_t* scales = dst + lanes_scales_offset(w.n, w.k);
  pool.parallel_for((w.n + rows - 1) / rows, [&](int64_t t, int) {
    const int64_t r0 = t * rows, r1 = std::min(w.n, r0 + rows);
    if (!ptq1) return stream ? pack_stream_rows(src, dst, r0, r1) : pack_lanes_rows(src, dst, r0, r1);
    if (stream) {  // transcode the task's rows, then re-lay them
      std::vector<uint8_t> rows_pq2(static_cast<size_t>(pq2_rb * (r1 - r0)));
      transcode_ptq1_rows(src, rows_pq2.data(), r0, r1, Isa::Avx2);
      // pack_stream_rows addresses rows by their index: view the buffer as
      // starting r0 rows earlier (only rows [r0, r1) are read).
      const WeightView part{DType::PQ2_0, rows_pq2.data() - r0 * pq2_rb, w.n, w.k};
      return pack_stream_rows(part, dst, r0, r1);
    }
    std::vector<uint8_t> tmp(static_cast<size_t>(pq2_rb));
    for (int64_t r = r0; r < r1; ++r) {
      transcode_ptq1_rows(src, tmp.data(), r, r + 1, Isa::Avx2);
      pack_lanes_row(tmp.data(), w.k, dst + r * code_rb, scales + r * nb * 2);
    }
  });
  return rp;
}
}  // namespace

std::unique_ptr<Repack> make_repack(const Weight& w, const RepackPolicy& policy, ThreadPool& pool, Isa isa) {
  if (w.empty() || w.n <= 0) return nullptr;
  const auto k = static_cast<uint64_t>(w.k);
  const bool lanes_type = w.type == DType::PQ2_0 || w.type == DType::Q2_0_G128 ||
                          (w.type == DType::PTQ1_0 && policy.ptq1_transcode);
  const bool relaid = policy.weights == WeightsMode::Lanes || policy.weights == WeightsMode::Stream;
  if (relaid && isa == Isa::Avx512 && lanes_type && w.k % 128 == 0)
    return make_lanes(w, pool, policy.weights == WeightsMode::Stream);
  if (w.type == DType::PTQ1_0 && policy.ptq1_transcode && w.k % 128 == 0) {
    auto r = std::make_unique<Repack>(DType::PQ2_0, row_bytes(DType::PQ2_0, k) * static_cast<size_t>(w.n));
    transcode_ptq1_to_pq2(view_of(w), r->bytes.data(), pool, isa == Isa::Scalar ? Isa::Scalar : Isa::Avx2);
    return r;
  }
  // Float matrices (the 27B's BF16 ssm_alpha / ssm_beta) join the ternary
  // weights in anonymous memory whenever those leave the file: read from the
  // file mapping, they measured 3-10x slower per token in some block-lanes runs
  // (their page-cache pages compete with the repacks on a 24 GB machine).
  const bool float_matrix =
      (w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16) && w.n > 1;
  const bool weights_off_file = policy.weights == WeightsMode::Copy || (relaid && isa == Isa::Avx512);
  const bool ternary_copy =
      (w.type == DType::PQ2_0 || w.type == DType::Q2_0_G128 || w.type == DType::Q2_0_G64) &&
      policy.weights == WeightsMode::Copy;
  if (ternary_copy || (float_matrix && weights_off_file)) {
    const size_t n = row_bytes(w.type, k) * static_cast<size_t>(w.n);
    auto r = std::make_unique<Repack>(w.type, n);
    constexpr size_t kTask = size_t{2} << 20;  // one huge page per task
    uint8_t* dst = r->bytes.data();
    pool.parallel_for(static_cast<int64_t>((n + kTask - 1) / kTask), [&](int64_t t, int) {
      const size_t o = static_cast<size_t>(t) * kTask;
      std::memcpy(dst + o, w.data + o, std::min(kTask, n - o));
    });
    return r;
  }
  return nullptr;
}

}  // namespace bonsai::cpu
