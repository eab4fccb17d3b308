#include "inspect_checks.h"

#include <fmt/core.h>

#include "bonsai/error.h"

namespace bonsai::cli {

std::vector<std::string> inspect_checks(const GgufFile& f) {
  std::vector<std::string> out;
  size_t g128 = 0, g64 = 0;
  for (const auto& t : f.tensors()) {
    if (t.dtype == DType::Q2_0_G128) ++g128;
    if (t.dtype == DType::Q2_0_G64) ++g64;
  }
  if (g128 || g64)
    out.push_back(fmt::format("Q2_0 layout: {} tensor(s) group-128 (PrismML legacy), {} group-64 (mainline ggml)", g128, g64));
  std::string_view tok = f.get_string_or("tokenizer.ggml.model", "");
  if (tok.empty()) out.push_back("tokenizer: none");
  else if (tok == "no_vocab") out.push_back("tokenizer: no_vocab (logits-only model: gate/bench work, text commands do not)");
  else if (f.has("tokenizer.ggml.tokens"))
    out.push_back(fmt::format("tokenizer: {} ({} tokens, pre = {})", tok, f.get_array("tokenizer.ggml.tokens").count,
                              f.get_string_or("tokenizer.ggml.pre", "(none)")));
  bool has_prism = false;
  for (const auto& [k, v] : f.metadata())
    if (k.rfind("prism.hadamard.", 0) == 0) has_prism = true;
  out.push_back(has_prism ? "prism.hadamard: keys present" : "prism.hadamard: no keys (unrotated model)");
  return out;
}

}  // namespace bonsai::cli
