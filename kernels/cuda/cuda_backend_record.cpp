// The CUDA backend's recorded decode steps (CUDA graphs) and its benchmark helpers.
#include <functional>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_backend_impl.h"

namespace bonsai {

// ---- recorded steps -------------------------------------------------------------------------

bool CudaBackend::replay_step(const int32_t* tokens, int t, int pos0) {
  impl_->flush();
  Impl& m = *impl_;
  if (!m.exec || t != 1) return false;
  if (m.exec_attn_plan != 0 &&
      cuda::attention_decode_plan(pos0 + 1, m.attn_wave, m.attn_mma_wave) != m.exec_attn_plan) {
    // The context has grown into another attention split count or kernel: this step runs eagerly (the
    // partials' buffer may have to grow, which a recording cannot do), the next one records.
    m.drop_recording();
    return false;
  }
  // The previous step ended with a synchronous read of its logits, so the graph's copy of
  // these pinned words has finished and they can be rewritten.
  int* h = static_cast<int*>(m.step_host.get());
  h[0] = pos0;
  h[1] = tokens[0];
  check(cudaGraphLaunch(m.exec, m.stream), "cudaGraphLaunch");
  m.invalidate_quant();
  return true;
}

bool CudaBackend::begin_capture(const int32_t* tokens, int t, int pos0) {
  impl_->flush();
  Impl& m = *impl_;
  if (t != 1 || m.capturing) return false;
  if (!m.warm) {  // the first step runs eagerly, so every buffer already has its size when recording
    m.warm = true;
    return false;
  }
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  int* h = static_cast<int*>(m.step_host.get());
  h[0] = pos0;
  h[1] = tokens[0];
  check(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  m.capturing = true;
  m.step_recording = true;
  m.rec_attn_plan = 0;
  m.invalidate_quant();
  // Recorded as a copy node: every replay reads the pinned words as they are at launch.
  check(cudaMemcpyAsync(m.step_dev, h, 2 * sizeof(int), cudaMemcpyHostToDevice, m.stream),
        "cudaMemcpy (step)");
  return true;
}

void CudaBackend::end_capture() {
  impl_->flush(Impl::MvLaunch::head);  // a decode step's last matmul, still held: the head
  Impl& m = *impl_;
  if (!m.capturing) return;
  m.capturing = false;
  m.step_recording = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(m.stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  if (m.exec) cudaGraphExecDestroy(m.exec);
  m.exec = exec;
  m.exec_attn_plan = m.rec_attn_plan;
  check(cudaGraphLaunch(m.exec, m.stream), "cudaGraphLaunch");
  m.invalidate_quant();
}

void CudaBackend::drop_capture() {
  Impl& m = *impl_;
  m.pend = Impl::Pending{};  // ops held back for an abandoned recording are dropped with it
  m.step_recording = false;
  if (m.capturing) {
    m.capturing = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(m.stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  m.drop_recording();
  m.invalidate_quant();
}

// ---- benchmarks ------------------------------------------------------------------------------

double CudaBackend::copy_bandwidth(size_t bytes, int reps) {
  impl_->flush();
  sync();
  return cuda::measure_copy_bandwidth(bytes, reps, impl_->stream);
}

double CudaBackend::read_chain_seconds(size_t bytes, int copies, int reps, int blocks_per_sm) {
  impl_->flush();
  sync();
  return cuda::measure_read_chain(bytes, copies, reps, blocks_per_sm * impl_->prop.multiProcessorCount,
                                  impl_->stream);
}

double CudaBackend::time_recorded(const std::function<void()>& ops, int reps) {
  impl_->flush();
  Impl& m = *impl_;
  ops();  // once eagerly: every buffer gets its size before recording
  sync();
  check(cudaStreamBeginCapture(m.stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  m.capturing = true;
  m.invalidate_quant();
  try {
    ops();
  } catch (...) {
    drop_capture();
    throw;
  }
  m.flush();
  m.capturing = false;
  cudaGraph_t graph = nullptr;
  check(cudaStreamEndCapture(m.stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(e, "cudaGraphInstantiate");
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  check(cudaEventCreate(&e0), "cudaEventCreate");
  check(cudaEventCreate(&e1), "cudaEventCreate");
  check(cudaGraphLaunch(exec, m.stream), "cudaGraphLaunch");  // warm-up
  check(cudaEventRecord(e0, m.stream), "cudaEventRecord");
  for (int r = 0; r < reps; ++r) check(cudaGraphLaunch(exec, m.stream), "cudaGraphLaunch");
  check(cudaEventRecord(e1, m.stream), "cudaEventRecord");
  check(cudaEventSynchronize(e1), "cudaEventSynchronize");
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  m.invalidate_quant();
  return ms * 1e-3 / reps;
}

}  // namespace bonsai
