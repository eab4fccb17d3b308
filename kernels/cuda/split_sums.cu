// The standalone sum of a deferred matvec's output (launch.h, matvec_split_sum): a thread per
// element of y, the slots of its row group added in rank order (split_sums.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/split_sums.cuh"

namespace bonsai::cuda {
namespace {

__global__ void split_sum_kernel(SplitSums s) {
  pdl_trigger();
  pdl_wait();  // the matvec's slots
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(s.t) * s.n) return;
  const int tok = static_cast<int>(i / s.n), row = static_cast<int>(i % s.n);
  bool split = false;
  const float v = split::load1(s, tok, row, &split);
  if (split) s.y[i] = v;  // whole groups were written by the matvec
}

}  // namespace

void matvec_split_sum(const SplitSums& y, cudaStream_t s) {
  launch(split_sum_kernel, blocks_for(static_cast<int64_t>(y.t) * y.n, 256), 256, 0, s, y);
}

}  // namespace bonsai::cuda
