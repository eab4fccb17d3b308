#include "kernels/cpu/repack.h"

#include <sys/mman.h>

#include <cstdlib>
#include <string_view>

#include "bonsai/error.h"
#include "kernels/cpu/matvec.h"

namespace bonsai::cpu {

HugeBuffer::HugeBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) fail("cpu repack: cannot map {} bytes of anonymous memory", bytes);
  p_ = static_cast<uint8_t*>(p);
  // Advice only: without THP (or with it off) this fails harmlessly.
  (void)madvise(p, bytes, MADV_HUGEPAGE);
}

HugeBuffer::~HugeBuffer() {
  if (p_) munmap(p_, n_);
}

bool ptq1_transcode_enabled() {
  const char* e = std::getenv("BONSAI_CPU_PTQ1");
  if (!e || !*e) return true;
  const std::string_view v(e);
  if (v == "transcode") return true;
  if (v == "direct") return false;
  usage_fail("BONSAI_CPU_PTQ1 must be 'direct' or 'transcode' (got '{}')", v);
}

Ptq1Repack::Ptq1Repack(const Weight& w, ThreadPool& pool, Isa isa)
    : bytes(static_cast<size_t>(row_bytes(DType::PQ2_0, static_cast<uint64_t>(w.k))) *
            static_cast<size_t>(w.n)) {
  if (w.type != DType::PTQ1_0) fail("cpu repack: weight {} is {}, not PTQ1_0", w.name, dtype_name(w.type));
  transcode_ptq1_to_pq2(view_of(w), bytes.data(), pool, isa == Isa::Scalar ? Isa::Scalar : Isa::Avx2);
}

}  // namespace bonsai::cpu
