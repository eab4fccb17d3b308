// The CUDA backend's cache hints (CudaBackend::set_cache_hints: the matvec's L2 evict-first
// weight loads, the GDN site's streaming state loads and stores): a cache policy changes
// where lines live, not what a kernel computes, so eager, recorded and replayed decode steps
// must give the same logits bit for bit with each hint on and off. Skips with the reason
// when there is no device.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "bonsai/formats.h"
#include "bonsai/model.h"
#include "bonsai/synth.h"
#include "model/graph.h"
#if BONSAI_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#include "temp_path.h"

namespace bonsai {
namespace {

#if BONSAI_HAVE_CUDA
std::string skip_reason() {
  std::string why;
  return cuda_device_count(&why) == 0 ? "no CUDA device: " + why : std::string();
}

TEST(CudaCacheHints, DecodeStepsAreBitIdenticalWithAndWithoutHints) {
  if (auto why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (DType type : {DType::PQ2_0, DType::Q2_0_G64}) {
    SynthOptions o = synth_preset("tiny");
    o.with_vocab = false;
    o.seed = 21;
    o.weight_type = type;
    const auto path = bonsai::testing::unique_temp_path("cuda_evict.gguf").string();
    write_synthetic_model(o, path);
    auto model = Model::load(path);
    const int64_t nv = model->config().n_vocab;
    // Step 0 runs eagerly, step 1 is recorded, the rest replay it.
    const std::vector<int32_t> tokens = {3, 100, 7, 900, 42, 5, 77, 12, 1, 64};
    auto run = [&](bool evict, bool stream) {
      CudaBackend be(0);
      be.set_cache_hints(evict, stream);
      Graph g(*model, be, 16);
      std::vector<float> out(tokens.size() * nv);
      for (size_t i = 0; i < tokens.size(); ++i)
        g.forward(&tokens[i], 1, static_cast<int>(i), out.data() + i * nv, false);
      return out;
    };
    const auto off = run(false, false);
    for (auto [evict, stream] : {std::pair{true, false}, std::pair{false, true}, std::pair{true, true}}) {
      const auto on = run(evict, stream);
      ASSERT_EQ(on.size(), off.size());
      EXPECT_EQ(std::memcmp(on.data(), off.data(), on.size() * sizeof(float)), 0)
          << dtype_name(type) << " evict-first " << evict << ", state streaming " << stream;
    }
    std::filesystem::remove(path);
  }
}
#else
TEST(CudaCacheHints, DecodeStepsAreBitIdenticalWithAndWithoutHints) {
  GTEST_SKIP() << "built without CUDA (BONSAI_CUDA=OFF)";
}
#endif

}  // namespace
}  // namespace bonsai
