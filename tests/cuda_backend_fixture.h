// A test fixture over one CudaBackend (device 0): device buffers through the backend's own
// interface, and F32 vector weights over host floats. Skips with the reason when there is no
// CUDA device. Only in builds with the CUDA backend (BONSAI_HAVE_CUDA).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/formats.h"
#include "kernels/cuda/cuda_backend.h"

namespace bonsai::testing {

class CudaBackendFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
    be_ = std::make_unique<CudaBackend>(0);
  }
  float* up(const std::vector<float>& v) {
    float* p = be_->alloc(v.size());
    be_->from_host(p, v.data(), v.size());
    return p;
  }
  std::vector<float> down(const float* p, size_t n) {
    std::vector<float> v(n);
    be_->to_host(v.data(), p, n);
    return v;
  }
  // The backend frees what it prepared when it goes (the Weight may be gone by then).
  Weight& prep(Weight& w) {
    be_->prepare(w);
    return w;
  }
  // An F32 vector weight over host floats (norm gains, conv taps, gates); v must outlive the test.
  Weight& vec(std::vector<float>& v, int64_t k, int64_t n = 1) {
    owned_.push_back(std::make_unique<Weight>());
    Weight& w = *owned_.back();
    w.name = "test vector";
    w.type = DType::F32;
    w.k = k;
    w.n = n;
    w.data = reinterpret_cast<const uint8_t*>(v.data());
    w.nbytes = v.size() * 4;
    return prep(w);
  }
  std::unique_ptr<CudaBackend> be_;
  std::vector<std::unique_ptr<Weight>> owned_;
};

}  // namespace bonsai::testing
