// A synthetic model written to a unique temp file for one test and loaded; the file is removed
// with the object (the loaded model keeps its mapping).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "bonsai/model.h"
#include "bonsai/synth.h"
#include "temp_path.h"

namespace bonsai::testing {

struct TempSynthModel {
  std::string path;
  std::unique_ptr<Model> model;
  TempSynthModel(const SynthOptions& o, std::string_view name) : path(unique_temp_path(name).string()) {
    write_synthetic_model(o, path);
    model = Model::load(path);
  }
  ~TempSynthModel() {
    std::error_code ec;
    std::filesystem::remove(path, ec);
  }
  TempSynthModel(const TempSynthModel&) = delete;
  TempSynthModel& operator=(const TempSynthModel&) = delete;
};

// The tiny preset without a vocabulary (logits-only work), with the given seed.
inline SynthOptions tiny_no_vocab(uint64_t seed) {
  SynthOptions o = synth_preset("tiny");
  o.with_vocab = false;
  o.seed = seed;
  return o;
}

}  // namespace bonsai::testing
