// A device copy of a host float vector for the CUDA kernel tests (RAII; cudaMalloc / cudaFree).
// Include only where BONSAI_HAVE_CUDA is set, after <cuda_runtime_api.h> and <gtest/gtest.h>.
#pragma once

#include <cstddef>
#include <vector>

namespace bonsai::testing_util {

class DevVec {
 public:
  explicit DevVec(const std::vector<float>& v) : n_(v.size()) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, n_ * sizeof(float)), cudaSuccess);
    p_ = static_cast<float*>(p);
    EXPECT_EQ(cudaMemcpy(p_, v.data(), n_ * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DevVec() { cudaFree(p_); }
  DevVec(const DevVec&) = delete;
  DevVec& operator=(const DevVec&) = delete;
  float* get() const { return p_; }
  std::vector<float> host() const {
    std::vector<float> v(n_);
    EXPECT_EQ(cudaMemcpy(v.data(), p_, n_ * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }

 private:
  float* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace bonsai::testing_util
