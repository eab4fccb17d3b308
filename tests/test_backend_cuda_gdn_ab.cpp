// The prefill GDN alpha/beta rows (kernels/cuda/gdn_ab_mma.cu on the tensor cores, gdn_ab_batch in
// kernels/cuda/gdn.cu on fp32 SIMT) against a double-precision host sum, for F32 / F16 / BF16
// rows: partial token tiles (t % 16 != 0, t < 16), partial row tiles (2·n_v % 24 != 0), a k
// tail (k % 16 != 0) and the 27B's shape (n_v = 48, k = 5120). Needs a device; skips with the
// reason when there is none.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "test_util.h"

#if BONSAI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda_dev_vec.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/gdn_ab_mma.h"

namespace bonsai {
namespace {

using testing_util::DevVec;
using testing_util::randn;

TEST(CudaGdnAb, RowsMatchDoubleSum) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  struct Case {
    int n_v, k, t;
    cuda::RawType type;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (const Case& cs : {Case{48, 5120, 40, cuda::RawType::BF16}, Case{48, 640, 300, cuda::RawType::F32},
                         Case{48, 640, 37, cuda::RawType::F16}, Case{5, 100, 45, cuda::RawType::F32},
                         Case{3, 96, 16, cuda::RawType::BF16}, Case{12, 256, 5, cuda::RawType::BF16}}) {
    const int n_v = cs.n_v, k = cs.k, t = cs.t;
    const size_t elem = cs.type == cuda::RawType::F32 ? 4 : 2, row_bytes = elem * k;
    // rows 0..n_v-1: ssm_alpha, n_v..2n_v-1: ssm_beta, and the values the device reads
    const auto w32 = randn(2 * static_cast<size_t>(n_v) * k, 500, 0.5f),
               x = randn(static_cast<size_t>(t) * k, 501);
    std::vector<uint8_t> bytes(2 * n_v * row_bytes);
    std::vector<double> wv(w32.size());
    for (size_t i = 0; i < w32.size(); ++i) {
      if (cs.type == cuda::RawType::F32) {
        std::memcpy(bytes.data() + 4 * i, &w32[i], 4);
        wv[i] = w32[i];
      } else {
        const bool f16 = cs.type == cuda::RawType::F16;
        const uint16_t b = f16 ? f32_to_fp16(w32[i]) : f32_to_bf16(w32[i]);
        std::memcpy(bytes.data() + 2 * i, &b, 2);
        wv[i] = f16 ? fp16_to_f32(b) : bf16_to_f32(b);
      }
    }
    DevVec d_w(std::vector<float>((bytes.size() + 3) / 4, 0.0f)), d_x(x);
    ASSERT_EQ(cudaMemcpy(d_w.get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    const auto* wa = reinterpret_cast<const uint8_t*>(d_w.get());
    const uint8_t* wb = wa + n_v * row_bytes;
    ASSERT_TRUE(cuda::gdn_ab_mma_fits(d_x.get(), wa, wb, row_bytes, cs.type, k));
    // Bound, per output: the mma kernel's error analysis (gdn_ab_mma.cu): (3·2^-22 + n·2^-23)·Σ|x w|
    // with n the longest fp32 chain of adds into one sum: each mma adds 8 products and the
    // accumulator (a tree of depth 4), 3 mmas per k8 step (F32), 2 steps per 16-column chunk,
    // ceil(chunks / 8) chunks per warp, then the 8 warps' partials. The SIMT kernel's chain
    // (k/256 + 5 + 8 adds at 2^-24) is shorter. A worst case: it catches any layout or
    // permutation slip (errors of O(Σ|x w|)), not a precision loss of a few bits.
    const int chunks = (k + 15) / 16, n_add = 4 * 3 * 2 * ((chunks + 7) / 8) + 8;
    const double rel = 3.0 * std::ldexp(1.0, -22) + n_add * std::ldexp(1.0, -23);
    std::vector<double> ref(static_cast<size_t>(t) * 2 * n_v), mag(ref.size());
    for (int i = 0; i < t; ++i)
      for (int r = 0; r < 2 * n_v; ++r) {
        double s = 0, m = 0;
        for (int c = 0; c < k; ++c) {
          const double p = double(x[static_cast<size_t>(i) * k + c]) * wv[static_cast<size_t>(r) * k + c];
          s += p;
          m += std::fabs(p);
        }
        ref[static_cast<size_t>(i) * 2 * n_v + r] = s;
        mag[static_cast<size_t>(i) * 2 * n_v + r] = m;
      }
    for (int kernel = 0; kernel < 3; ++kernel) {
      const std::string what = "n_v " + std::to_string(n_v) + " k " + std::to_string(k) + " t " +
                               std::to_string(t) + " kernel " + std::to_string(kernel);
      const std::vector<float> nan(static_cast<size_t>(t) * n_v, std::nanf(""));
      DevVec d_a(nan), d_b(nan);
      if (kernel == 0)
        cuda::gdn_ab_batch(d_x.get(), wa, wb, row_bytes, cs.type, k, n_v, t, d_a.get(), d_b.get(), stream);
      else if (kernel == 1)
        cuda::gdn_ab_mma(d_x.get(), wa, wb, row_bytes, cs.type, k, n_v, t, d_a.get(), d_b.get(), stream);
      else  // the site's dispatch (mma from kGdnAbMmaMinTokens tokens on)
        cuda::gdn_ab_rows(d_x.get(), wa, wb, row_bytes, cs.type, k, n_v, t, d_a.get(), d_b.get(),
                          cuda::GdnAbKernel::mma, stream);
      ASSERT_EQ(cudaGetLastError(), cudaSuccess) << what;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << what;
      const auto a = d_a.host(), b = d_b.host();
      int bad = 0;
      for (int i = 0; i < t; ++i)
        for (int r = 0; r < 2 * n_v; ++r) {
          const float got =
              r < n_v ? a[static_cast<size_t>(i) * n_v + r] : b[static_cast<size_t>(i) * n_v + r - n_v];
          const size_t e = static_cast<size_t>(i) * 2 * n_v + r;
          if (!(std::fabs(got - ref[e]) <= rel * mag[e]) && ++bad <= 5)
            ADD_FAILURE() << what << " token " << i << " row " << r << ": " << got << " vs " << ref[e]
                          << " (bound " << rel * mag[e] << ")";
        }
      EXPECT_EQ(bad, 0) << what;
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace bonsai
#endif  // BONSAI_HAVE_CUDA
