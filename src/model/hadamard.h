// prism.hadamard.* metadata: parsed and validated once at load (SPEC §3).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

namespace bonsai {

class GgufFile;
struct ModelConfig;

struct HadamardSpec {
  int version = 1;
  int64_t block = 0;                            // B, power of two
  bool explicit_signs = true;                   // sign_mode explicit (false: identity, all +1)
  bool gdn_v_grouped = false;                   // ssm_out input columns in grouped head order
  bool tied_output = false;                     // version 2: token_embd is also the (folded) head
  std::map<int64_t, std::vector<float>> signs;  // input width K -> K values ±1
  std::set<std::string> folded;                 // weight_names
  std::set<std::string> inverse;                // inverse_weight_names (only token_embd.weight)

  bool is_folded(const std::string& name) const { return folded.count(name) != 0; }
  // Signs for width k (nullptr for identity mode).
  const std::vector<float>* signs_for(int64_t k) const;

  // Returns nullptr when the file has no prism.hadamard keys. Throws bonsai::Error
  // naming the key when present keys are missing, malformed or contradictory.
  // Checks against the model's tensors happen in validate_against().
  static std::unique_ptr<HadamardSpec> parse(const GgufFile& f);
  // Cross-checks the keys with the model: every weight_names entry exists and is
  // a ternary linear of the graph, every such linear is listed, the block size
  // divides every folded K, a sign vector covers every folded width, the tied
  // head agrees with the version.
  void validate_against(const GgufFile& f, const ModelConfig& c) const;
};

}  // namespace bonsai
