// A loaded Bonsai 2 (qwen35) model: the mapped file, its hyperparameters, the
// validated Hadamard metadata and every weight bound by name with its
// expected shape. Loading applies the loader conventions of
// docs/loader-conventions.md; nothing here knows which backend will run it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bonsai/config.h"
#include "bonsai/gguf.h"

namespace bonsai {

struct LoadOptions {
  // Called with (tensors bound, total) while loading; may be empty.
  std::function<void(size_t, size_t)> progress;
};

struct HadamardSpec;  // src/model/hadamard.h
struct ModelWeights;  // src/model/weights.h

class Model {
 public:
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& opts = {});
  // The same checks on a file already opened (GgufFile::open or from_memory;
  // an in-memory image must outlive the Model). The fuzzer loads this way so
  // that ASan sees any read past the exact end of the image.
  static std::unique_ptr<Model> from_gguf(GgufFile f, const LoadOptions& opts = {});
  ~Model();

  const std::string& path() const { return file_.path(); }
  const GgufFile& file() const { return file_; }
  const ModelConfig& config() const { return config_; }
  const HadamardSpec* hadamard() const { return hadamard_.get(); }  // nullptr: unrotated model
  const ModelWeights& weights() const { return *weights_; }
  // True when the file carries a usable tokenizer (not `no_vocab`).
  bool has_vocab() const;
  uint64_t weight_bytes() const;  // bytes of all tensors
  uint64_t n_params() const;      // elements of all tensors

 private:
  explicit Model(GgufFile f);
  GgufFile file_;
  ModelConfig config_;
  std::unique_ptr<HadamardSpec> hadamard_;
  std::unique_ptr<ModelWeights> weights_;
};

}  // namespace bonsai
