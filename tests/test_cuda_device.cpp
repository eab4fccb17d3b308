// The CUDA device: which one the cuda and auto paths use (-mg / --main-gpu, SessionOptions::main_gpu)
// with one clear usage error for an index the machine does not have, and what running out of its
// memory says. The device cases need a CUDA device and skip with the reason when there is none.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bonsai/error.h"
#include "bonsai/session.h"
#include "session/backend_registry.h"
#if BONSAI_HAVE_CUDA
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "kernels/cuda/cuda_backend.h"
#endif

namespace bonsai {
namespace {

std::string usage_error(const std::string& path, int main_gpu) {
  try {
    check_main_gpu(path, main_gpu);
  } catch (const UsageError& e) {
    return e.what();
  }
  return {};
}

TEST(MainGpu, NegativeIsRefusedOnEveryPath) {
  for (const char* path : {"ref", "fast", "auto", "cuda"})
    EXPECT_NE(usage_error(path, -1).find("-mg/--main-gpu must be >= 0 (a CUDA device index), got -1"),
              std::string::npos)
        << path;
}

TEST(MainGpu, CpuPathsIgnoreTheIndex) {
  for (const char* path : {"ref", "fast", "cpu", "fast-int8"}) {
    EXPECT_EQ(usage_error(path, 7), "") << path;
    EXPECT_EQ(create_backend(path, 1, 7)->name().find("cuda"), std::string_view::npos) << path;
  }
}

#if BONSAI_HAVE_CUDA
TEST(MainGpu, PastTheLastDeviceIsAUsageErrorWithTheRange) {
  std::string why;
  const int n = cuda_device_count(&why);
  if (n == 0) {
    // Nothing to check the index against: auto runs on the CPU, cuda is refused with the reason.
    EXPECT_EQ(usage_error("auto", 3), "");
    try {
      check_main_gpu("cuda", 0);
      ADD_FAILURE() << "the cuda path without a device passed";
    } catch (const UsageError& e) {
      ADD_FAILURE() << "not a usage error: " << e.what();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "cuda: no usable device (" + why + ")");
    }
    GTEST_SKIP() << "no CUDA device: " << why;
  }
  const std::string want = fmt::format("-mg/--main-gpu {}: this machine has {} CUDA device{} (valid: 0..{})",
                                       n, n, n == 1 ? "" : "s", n - 1);
  for (const char* path : {"cuda", "auto"}) {
    EXPECT_EQ(usage_error(path, n), want) << path;
    EXPECT_EQ(usage_error(path, n - 1), "") << path;
    EXPECT_THROW(create_backend(path, 1, n), UsageError) << path;
  }
  // The last device is the one the backend runs on.
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, n - 1), cudaSuccess);
  const auto be = create_backend("cuda", 1, n - 1);
  EXPECT_EQ(static_cast<CudaBackend&>(*be).device_name(), prop.name);
}

// One error that names the request and the device's free memory; the backend works on afterwards.
TEST(CudaDeviceMemory, OutOfMemoryNamesTheSizes) {
  std::string why;
  if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why;
  CudaBackend be(0);
  std::string msg;
  try {
    be.alloc(size_t{1} << 38);  // 1 TiB of floats: more than any device has
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(
      msg.find("cuda: out of device memory: an activation / cache buffer needs 1024.00 GiB, device 0 has "),
      std::string::npos)
      << msg;
  EXPECT_NE(msg.find(" GiB free of "), std::string::npos) << msg;
  const std::vector<float> v = {1.0f, -2.0f, 3.5f};
  float* p = be.alloc(v.size());
  be.from_host(p, v.data(), v.size());
  std::vector<float> back(v.size());
  be.to_host(back.data(), p, back.size());
  EXPECT_EQ(back, v);
}
#endif

}  // namespace
}  // namespace bonsai
