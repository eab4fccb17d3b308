// What one kernel boundary costs in a decode-like chain (issue 7; docs/performance.md, "Session 9:
// kernel boundary probe"). A chain of N kernels, alternating a "matvec-sized" grid (2 blocks per SM)
// and a "site-sized" grid (a few blocks), each reading what the previous one wrote and writing its
// own output, recorded once in a CUDA graph and replayed. Hand-off modes:
//   pdl   programmatic dependent launch (each kernel triggers its dependents at its start, then
//         griddepcontrol.wait: returns once the previous grid has completed and its writes are
//         visible) — how bonsai's decode step runs today;
//   flag  the same launches, but instead of griddepcontrol.wait a kernel's thread 0 polls a flag
//         of the previous kernel (ld.acquire.gpu) that its last block to finish sets (each block:
//         barrier, __threadfence, atomicAdd on the kernel's counter; the last one a st.release) —
//         a hand-off inside the graph that does not wait for the grid's completion;
//   plain no launch attribute: stream order (a kernel starts once the previous one completed);
//   pdl-late  as pdl, but each block triggers its dependents after its own work (loads and store).
// Work per kernel: every thread loads W words of the previous output (ld.global.cg, L2) and adds
// them, so W = 1 is the bare boundary and larger W a site's round trips.
// The flags and counters are zeroed by memset nodes at the graph's start (normal edges).
//
// Build (here; runs on sm_90): nvcc -O3 -std=c++20 -I. -gencode arch=compute_90a,code=sm_90a
//   -o boundary_probe tools/cuda/boundary_probe.cu        (one line)
// Run: boundary_probe [--n 512] [--reps 20] [--big-smem-kb 0]
// Prints µs per kernel for each mode, chain shape (alternating / all big / all small) and W, and
// checks that the chain's last output holds the expected value (each link adds 1).
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tools/cuda/probe_ck.h"

namespace {

constexpr int kThreads = 256;
constexpr int kOut = 1 << 16;  // words per output buffer (each kernel writes its grid's threads' words)

struct Link {
  const unsigned* in;         // previous kernel's output
  unsigned* out;              // this kernel's output
  const unsigned* prev_flag;  // flag mode: set by the previous kernel's last block (nullptr: first)
  unsigned* flag;
  unsigned* counter;
  int mode;  // 0 pdl (trigger at the start), 1 flag, 2 plain, 3 pdl with the trigger after the block's work
  int late;  // mode 0: this link triggers after its work anyway (mixed placements)
  int work;  // words loaded per thread
};

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__global__ void link_kernel(Link a) {
  const bool late = a.mode == 3 || a.late;
  if (!late) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (a.mode == 1) {
    if (a.prev_flag) {
      if (threadIdx.x == 0)
        while (ld_acquire(a.prev_flag) == 0) {
        }
      __syncthreads();
    }
  } else {
    asm volatile("griddepcontrol.wait;" ::: "memory");  // a no-op without the attribute
  }
  const int tid = blockIdx.x * blockDim.x + threadIdx.x;
  // every thread reads word 0 (the chain's value) plus work - 1 other words, all in flight at once
  unsigned v = __ldcg(a.in);
  unsigned extra = 0;
  for (int j = 1; j < a.work; ++j) extra += __ldcg(a.in + ((tid * 7 + j * 4099) & (kOut - 1)));
  // (extra never equals the constant: the words are chain values < 2^20; the compare keeps the loads)
  if (tid < kOut) a.out[tid] = (tid == 0 ? v + 1 : v) + (extra == 0x9E3779B9u ? 1u : 0u);
  if (late) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // late trigger
  if (a.mode == 1) {
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      const unsigned old = atomicAdd(a.counter, 1u);
      if (old == gridDim.x - 1) {
        __threadfence();
        st_release(a.flag, 1u);
      }
    }
  }
}

struct Chain {
  int n = 0;
  std::vector<int> grids, works;  // works: words per thread of each link (0: the run's W)
};

// mode 4: pdl, big links trigger late, small ones at the start; mode 5: the other way round.
// big_smem: dynamic shared memory of a big link (bytes), so that no more than 2 big blocks fit an SM
// (as the matvec's rings do): a big grid cannot become resident next to the previous big one.
float run(const Chain& c, int mode, int work, int reps, unsigned* bufs, unsigned* flags, unsigned* counters,
          bool* ok, int big_grid, int big_smem) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaMemset(bufs, 0, 2 * kOut * sizeof(unsigned)));
  cudaGraph_t g;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  CK(cudaMemsetAsync(flags, 0, c.n * sizeof(unsigned), s));
  CK(cudaMemsetAsync(counters, 0, c.n * sizeof(unsigned), s));
  for (int i = 0; i < c.n; ++i) {
    const bool is_big = c.grids[i] == big_grid;
    const int kmode = mode >= 4 ? 0 : mode;
    const int late = (mode == 4 && is_big) || (mode == 5 && !is_big);
    Link a{bufs + (i % 2) * kOut,
           bufs + ((i + 1) % 2) * kOut,
           i ? flags + i - 1 : nullptr,
           flags + i,
           counters + i,
           kmode,
           late,
           c.works[i] ? c.works[i] : work};
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(c.grids[i]);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = s;
    cfg.dynamicSmemBytes = is_big ? big_smem : 0;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    // the first link follows the memsets in stream order (they must have finished)
    cfg.attrs = attr;
    cfg.numAttrs = (mode == 2 || i == 0) ? 0 : 1;  // every mode but plain: programmatic
    CK(cudaLaunchKernelEx(&cfg, link_kernel, a));
  }
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t ge;
  CK(cudaGraphInstantiate(&ge, g, 0));
  // the chain's value: word 0 of the last output; each replay restarts from the buffer the
  // previous replay left, so after R replays of n links it is R·n (buffers alternate: n even)
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaGraphLaunch(ge, s));  // warm-up
  CK(cudaStreamSynchronize(s));
  CK(cudaEventRecord(e0, s));
  for (int r = 0; r < reps; ++r) CK(cudaGraphLaunch(ge, s));
  CK(cudaEventRecord(e1, s));
  CK(cudaStreamSynchronize(s));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  unsigned last = 0;
  CK(cudaMemcpy(&last, bufs + (c.n % 2) * kOut, sizeof(unsigned), cudaMemcpyDeviceToHost));
  *ok = last == static_cast<unsigned>((reps + 1) * c.n);
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
  return 1000.0f * ms / (reps * c.n);
}

}  // namespace

int main(int argc, char** argv) {
  int n = 512, reps = 20, big_smem = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--big-smem-kb")) big_smem = std::atoi(argv[i + 1]) * 1024;
    if (!std::strcmp(argv[i], "--n")) n = std::atoi(argv[i + 1]) & ~1;
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaFuncSetAttribute(link_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  unsigned *bufs, *flags, *counters;
  CK(cudaMalloc(&bufs, 2 * kOut * sizeof(unsigned)));
  CK(cudaMalloc(&flags, n * sizeof(unsigned)));
  CK(cudaMalloc(&counters, n * sizeof(unsigned)));
  const int big = 2 * sms, small = 6;
  struct Shape {
    const char* name;
    Chain c;
  } shapes[4];
  shapes[0].name = "alternating big/small";
  shapes[1].name = "all big";
  shapes[2].name = "all small";
  shapes[3].name = "alternating big (W) / small (W = 1)";
  for (auto& sh : shapes) sh.c.n = n;
  for (int i = 0; i < n; ++i) {
    shapes[0].c.grids.push_back(i % 2 ? small : big);
    shapes[1].c.grids.push_back(big);
    shapes[2].c.grids.push_back(small);
    shapes[3].c.grids.push_back(i % 2 ? small : big);
    for (int k = 0; k < 3; ++k) shapes[k].c.works.push_back(0);
    shapes[3].c.works.push_back(i % 2 ? 1 : 0);
  }
  std::printf("SMs %d, big grid %d x %d (%d KB shared each), small grid %d x %d, %d links, %d replays\n", sms,
              big, kThreads, big_smem / 1024, small, kThreads, n, reps);
  std::printf(
      "| chain | words per thread | pdl, trigger at start us/link | flag | plain | pdl, trigger after the "
      "work | pdl, "
      "big late, small early | pdl, big early, small late |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
  const char* mode_names[6] = {"pdl", "flag", "plain", "pdl-late", "big-late", "small-late"};
  for (auto& sh : shapes)
    for (int work : {1, 8, 32}) {
      float t[6];
      for (int mode = 0; mode < 6; ++mode) {
        bool ok = false;
        t[mode] = run(sh.c, mode, work, reps, bufs, flags, counters, &ok, big, big_smem);
        if (!ok) std::printf("CHECK FAILED: %s, %s, W=%d\n", sh.name, mode_names[mode], work);
      }
      std::printf("| %s | %d | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", sh.name, work, t[0], t[1], t[2],
                  t[3], t[4], t[5]);
    }
  return 0;
}
