// Kernel timeline without nsys (the H200 machine has ncu only): a CUDA injection library that
// records every kernel's GPU start/end through CUPTI's activity API, with kernels of a graph
// replay and programmatic-dependent-launch overlap kept as they ran (CONCURRENT_KERNEL kind).
//
// Build on a machine whose toolkit has CUPTI (the device; this repo's build does not need it):
//   g++ -O2 -shared -fPIC -I$CUDA/extras/CUPTI/include -I$CUDA/include -DKREC=CUpti_ActivityKernelN \
//       tools/cuda/cupti_trace.cpp -o cupti_trace.so -L$CUDA/extras/CUPTI/lib64 -lcupti
//   (N: the newest CUpti_ActivityKernel record in that CUPTI's cupti_activity.h)
// Use: CUDA_INJECTION64_PATH=$PWD/cupti_trace.so BONSAI_TRACE_OUT=trace.csv bonsai bench ...
// Output: one CSV line per kernel: start_ns,end_ns,grid,block,stream,graph_node,name (mangled);
// with BONSAI_TRACE_MEMCPY=1 also one per memory copy, named memcpy:<CUpti_ActivityMemcpyKind>
// (1 = host to device, 2 = device to host) with its byte count in the grid column.
// Summary: python3 tools/cuda/trace_summary.py trace.csv.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif
#ifndef MREC
#define MREC CUpti_ActivityMemcpy6  // BONSAI_TRACE_MEMCPY=1 only
#endif

namespace {

FILE* out_file() {
  static FILE* f = [] {
    const char* p = std::getenv("BONSAI_TRACE_OUT");
    FILE* h = std::fopen(p ? p : "cupti_trace.csv", "w");
    if (h) std::fputs("start_ns,end_ns,grid,block,stream,graph_node,name\n", h);
    return h;
  }();
  return f;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kSize = 16u << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kSize));
  *size = kSize;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  FILE* f = out_file();
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {  // name "memcpy:<kind>", grid = bytes
      const auto* m = reinterpret_cast<const MREC*>(rec);
      if (f)
        std::fprintf(f, "%llu,%llu,%llu,0,%u,%llu,memcpy:%u\n", static_cast<unsigned long long>(m->start),
                     static_cast<unsigned long long>(m->end), static_cast<unsigned long long>(m->bytes),
                     m->streamId, static_cast<unsigned long long>(m->graphNodeId),
                     static_cast<unsigned>(m->copyKind));
      continue;
    }
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL)
      continue;
    const auto* k = reinterpret_cast<const KREC*>(rec);
    if (f)
      std::fprintf(f, "%llu,%llu,%d,%d,%u,%llu,%s\n", static_cast<unsigned long long>(k->start),
                   static_cast<unsigned long long>(k->end), k->gridX * k->gridY * k->gridZ,
                   k->blockX * k->blockY, k->streamId, static_cast<unsigned long long>(k->graphNodeId),
                   k->name ? k->name : "?");
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped) std::fprintf(stderr, "cupti_trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

void flush_at_exit() {
  cuptiActivityFlushAll(1);
  if (FILE* f = out_file()) std::fflush(f);
}

}  // namespace

extern "C" int InitializeInjection() {
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  if (const char* m = std::getenv("BONSAI_TRACE_MEMCPY"); m && std::strcmp(m, "1") == 0)
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS) return 0;
  std::atexit(flush_at_exit);
  return 1;
}
