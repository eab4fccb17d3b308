// CudaBackend::top_k: the head's candidates selected on the device (kernels/cuda/topk.cu)
// so that a sampler that needs only the best few logits copies 2k words instead of the
// n_vocab row.
#include <cstring>

#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/ref/topk.h"

namespace bonsai {

void CudaBackend::top_k(const float* x, int64_t n, int k, int32_t* ids, float* values) {
  ref::check_top_k(n, k);
  Impl& m = *impl_;
  m.flush(Impl::MvLaunch::head);  // a matmul still held is the one that wrote x: the head
  // The copy below waits on the stream, which a recording may not do.
  if (m.capturing) fail("cuda: top_k while a step is being recorded");
  const size_t scratch = cuda::top_k_scratch_words(n, k);
  // Growable::grow, not Impl::grow: this buffer is never part of a recorded step, so a new
  // address does not make the recording stale.
  m.topk.grow((scratch + 2 * static_cast<size_t>(kMaxTopK)) * sizeof(uint32_t), "top-k scratch");
  if (!m.topk_host) {
    void* h = nullptr;
    check(cudaMallocHost(&h, 2 * kMaxTopK * sizeof(uint32_t)), "cudaMallocHost (top-k result)");
    m.topk_host.reset(h);
  }
  uint32_t* dev = m.topk.as<uint32_t>();
  uint32_t* out = dev + scratch;
  cuda::top_k(x, n, k, dev, out, m.stream);
  check_launch("top_k");
  const size_t bytes = 2 * static_cast<size_t>(k) * sizeof(uint32_t);
  check(cudaMemcpyAsync(m.topk_host.get(), out, bytes, cudaMemcpyDeviceToHost, m.stream),
        "cudaMemcpy D2H (top-k)");
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  const auto* h = static_cast<const uint32_t*>(m.topk_host.get());
  std::memcpy(ids, h, static_cast<size_t>(k) * sizeof(int32_t));
  std::memcpy(values, h + k, static_cast<size_t>(k) * sizeof(float));
}

}  // namespace bonsai
