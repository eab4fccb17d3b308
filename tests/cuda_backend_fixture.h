// A test fixture over one CudaBackend (device 0): device buffers through the backend's own
// interface, and F32 vector weights over host floats. Skips with the reason when there is no
// CUDA device. Only in builds with the CUDA backend (BONSAI_HAVE_CUDA).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend_io.h"
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
  float* up(const std::vector<float>& v) { return testing_util::upload(*be_, v); }
  std::vector<float> down(const float* p, size_t n) { return testing_util::download(*be_, p, n); }
  // The backend frees what it prepared when it goes (the Weight may be gone by then).
  Weight& prep(Weight& w) {
    be_->prepare(w);
    return w;
  }
  // An F32 vector weight over host floats (norm gains, conv taps, gates); v must outlive the test.
  Weight& vec(std::vector<float>& v, int64_t k, int64_t n = 1) {
    return testing_util::prepared_vector(*be_, owned_, v, k, n);
  }
  std::unique_ptr<CudaBackend> be_;
  std::vector<std::unique_ptr<Weight>> owned_;
};

}  // namespace bonsai::testing
