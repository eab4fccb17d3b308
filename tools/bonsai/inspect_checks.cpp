#include "inspect_checks.h"

#include <algorithm>

#include <fmt/core.h>

#include "bonsai/config.h"
#include "bonsai/error.h"
#include "model/hadamard.h"

namespace bonsai::cli {

std::vector<std::string> inspect_checks(const GgufFile& f) {
  std::vector<std::string> out;
  size_t g128 = 0, g64 = 0;
  for (const auto& t : f.tensors()) {
    if (t.dtype == DType::Q2_0_G128) ++g128;
    if (t.dtype == DType::Q2_0_G64) ++g64;
  }
  if (g128 || g64)
    out.push_back(fmt::format(
        "Q2_0 layout: {} tensor(s) group-128 (PrismML legacy), {} group-64 (mainline ggml)", g128, g64));
  std::string_view tok = f.get_string_or("tokenizer.ggml.model", "");
  if (tok.empty())
    out.push_back("tokenizer: none");
  else if (tok == "no_vocab")
    out.push_back("tokenizer: no_vocab (logits-only model: gate/bench work, text commands do not)");
  else if (f.has("tokenizer.ggml.tokens"))
    out.push_back(fmt::format("tokenizer: {} ({} tokens, pre = {})", tok,
                              f.get_array("tokenizer.ggml.tokens").count,
                              f.get_string_or("tokenizer.ggml.pre", "(none)")));

  // The model-level checks the loader applies, reported instead of thrown.
  if (f.get_string_or("general.architecture", "") != "qwen35" || f.tensors().empty()) {
    bool has_prism = false;
    for (const auto& [k, v] : f.metadata())
      if (k.rfind("prism.hadamard.", 0) == 0) has_prism = true;
    out.push_back(has_prism ? "prism.hadamard: keys present (no qwen35 model to check them against)"
                            : "prism.hadamard: no keys");
    return out;
  }
  try {
    ModelConfig c = ModelConfig::from_gguf(f);
    out.push_back(
        fmt::format("qwen35: {} layers ({} Gated DeltaNet, {} full attention), embd {}, ff {}, vocab {}{}",
                    c.n_layer, std::count(c.recurrent.begin(), c.recurrent.end(), 1),
                    c.n_layer - std::count(c.recurrent.begin(), c.recurrent.end(), 1), c.n_embd, c.n_ff,
                    c.n_vocab, c.tied_output ? ", tied head" : ""));
    auto h = HadamardSpec::parse(f);
    if (!h) {
      out.push_back("prism.hadamard: no keys (unrotated model)");
    } else {
      h->validate_against(f, c);
      std::string widths;
      for (const auto& [w, s] : h->signs) widths += fmt::format("{}{}", widths.empty() ? "" : ", ", w);
      out.push_back(
          fmt::format("prism.hadamard: consistent (version {}, block {}, signs {} for widths [{}], {} folded "
                      "weights, gdn_v_grouped {}{})",
                      h->version, h->block, h->explicit_signs ? "explicit" : "identity", widths,
                      h->folded.size(), h->gdn_v_grouped, h->tied_output ? ", tied_output" : ""));
    }
  } catch (const Error& e) {
    out.push_back(fmt::format("NOT RUNNABLE: {}", e.what()));
  }
  return out;
}

}  // namespace bonsai::cli
