#include "bonsai/model.h"

#include <cmath>

#include "bonsai/error.h"
#include "bonsai/tokenizer.h"
#include "model/hadamard.h"
#include "model/weights.h"

namespace bonsai {

Model::Model(GgufFile f) : file_(std::move(f)) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& opts) {
  return from_gguf(GgufFile::open(path), opts);
}

std::unique_ptr<Model> Model::from_gguf(GgufFile file, const LoadOptions& opts) {
  std::unique_ptr<Model> m(new Model(std::move(file)));
  const GgufFile& f = m->file_;
  const std::string& path = f.path();
  m->config_ = ModelConfig::from_gguf(f);
  m->hadamard_ = HadamardSpec::parse(f);
  if (m->hadamard_) {
    m->hadamard_->validate_against(f, m->config_);
  } else {
    // PQ2_0 / PTQ1_0 exist only in PrismML's folded Bonsai 2 files: without the
    // rotation keys the stored weights are in the wrong basis and the output is garbage.
    for (const auto& t : f.tensors())
      if (t.dtype == DType::PQ2_0 || t.dtype == DType::PTQ1_0)
        fail(
            "{}: tensor '{}' is {} but the file has no prism.hadamard.* keys: Bonsai 2 weights are stored in "
            "a "
            "Hadamard-rotated basis and cannot be run without the rotation metadata",
            path, t.name, dtype_name(t.dtype));
  }
  m->weights_ = ModelWeights::bind(f, m->config_);
  for (const auto& L : m->weights_->layers) {
    if (!L.recurrent) continue;
    const float* a = L.ssm_a.f32();
    for (int64_t i = 0; i < L.ssm_a.k; ++i)
      if (!(a[i] < 0.0f) || !std::isfinite(a[i]))
        fail("{}: tensor '{}' element {} = {}: ssm_a must hold -exp(A_log) < 0", path, L.ssm_a.name, i, a[i]);
  }
  if (opts.progress) opts.progress(f.tensors().size(), f.tensors().size());
  return m;
}

bool Model::has_vocab() const { return Tokenizer::has_vocab(file_); }  // one rule for both

uint64_t Model::weight_bytes() const {
  uint64_t b = 0;
  for (const auto& t : file_.tensors()) b += t.nbytes;
  return b;
}

uint64_t Model::n_params() const {
  uint64_t n = 0;
  for (const auto& t : file_.tensors()) n += t.nelements;
  return n;
}

}  // namespace bonsai
