// Self-consistency of the reference forward pass without fixtures: a folded
// synthetic model and its unrotated F32 twin must give the same logits. This
// pins the rotation (sign then FWHT), the embedding inverse (FWHT then sign),
// the tiled->grouped permutation before ssm_out and the tied head,
// independently of the reference logits.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "bonsai/model.h"
#include "bonsai/session.h"
#include "bonsai/synth.h"
#include "temp_path.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;

struct TwinCase {
  const char* name;
  DType type;
  bool tied;
  uint32_t block;
};

class FoldedVsTwin : public ::testing::TestWithParam<TwinCase> {};

TEST_P(FoldedVsTwin, SameLogits) {
  const TwinCase& tc = GetParam();
  SynthOptions o = synth_preset("tiny");
  o.weight_type = tc.type;
  o.with_vocab = false;
  o.hadamard_block = tc.block;
  o.seed = 11;
  // Non-trivial GQA/GDN ratios so the permutation is not the identity: rep = n_v / n_k = 3.
  o.config.ssm_n_k = 2;
  o.config.ssm_n_v = 6;
  o.config.ssm_d_inner = 6 * 128;
  o.config.n_ff = 768;
  if (tc.tied) {
    o.config.tied_output = true;
    o.hadamard_version = 2;
  }
  const fs::path folded = bonsai::testing::unique_temp_path(std::string("twin_") + tc.name + ".gguf");
  const fs::path twin = bonsai::testing::unique_temp_path(std::string("twin_") + tc.name + ".f32.gguf");
  write_synthetic_model(o, folded.string());
  write_unfolded_f32_twin(o, twin.string());

  auto a = Model::load(folded.string());
  auto b = Model::load(twin.string());
  ASSERT_NE(a->hadamard(), nullptr);
  ASSERT_EQ(b->hadamard(), nullptr);
  SessionOptions so;
  so.n_ctx = 16;
  Session sa(*a, so), sb(*b, so);
  const int32_t tokens[] = {1, 17, 300, 5, 999, 42, 7, 128, 64, 3};
  for (int32_t t : tokens) {
    auto la = sa.decode(t);
    auto lb = sb.decode(t);
    double mx = 0, d = 0;
    for (size_t i = 0; i < la.size(); ++i) {
      mx = std::max(mx, std::fabs(static_cast<double>(lb[i])));
      d = std::max(d, std::fabs(static_cast<double>(la[i]) - lb[i]));
    }
    // Both are F32 evaluations of the same function in a different order; the
    // difference is rounding noise (~1e-6 relative per op over a few layers).
    // A wrong sign order, permutation or transpose gives O(1) differences.
    EXPECT_LE(d, 1e-4 * std::max(1.0, mx)) << "token " << t;
  }
  fs::remove(folded);
  fs::remove(twin);
}

INSTANTIATE_TEST_SUITE_P(Rotation, FoldedVsTwin,
                         ::testing::Values(TwinCase{"pq2_b128", DType::PQ2_0, false, 128},
                                           TwinCase{"ptq1_b256", DType::PTQ1_0, false, 256},
                                           TwinCase{"q2g64_b128", DType::Q2_0_G64, false, 128},
                                           TwinCase{"tied_pq2", DType::PQ2_0, true, 128}),
                         [](const ::testing::TestParamInfo<TwinCase>& p) {
                           return std::string(p.param.name);
                         });

}  // namespace
}  // namespace bonsai
