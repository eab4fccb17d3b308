#include "model/hadamard.h"

#include <cmath>

#include "bonsai/config.h"
#include "bonsai/error.h"
#include "bonsai/gguf.h"

namespace bonsai {
namespace {
constexpr const char* P = "prism.hadamard.";
std::string k(const char* name) { return std::string(P) + name; }

std::vector<std::string> string_array(const GgufFile& f, const std::string& key) {
  const GgufValue& v = f.get_array(key, GgufType::STRING);
  return {v.strings.begin(), v.strings.end()};
}
}  // namespace

const std::vector<float>* HadamardSpec::signs_for(int64_t width) const {
  auto it = signs.find(width);
  return it == signs.end() ? nullptr : &it->second;
}

std::unique_ptr<HadamardSpec> HadamardSpec::parse(const GgufFile& f) {
  bool any = false;
  for (const auto& [key, v] : f.metadata())
    if (key.rfind(P, 0) == 0) any = true;
  if (!any) return nullptr;

  auto h = std::make_unique<HadamardSpec>();
  const std::string& path = f.path();
  int64_t version = f.get_i64(k("version"));
  if (version != 1 && version != 2)
    fail("{}: key '{}' = {}: supported versions are 1 and 2", path, k("version"), version);
  h->version = static_cast<int>(version);

  int64_t block = f.get_i64(k("block_size"));
  if (block < 2 || block > (1 << 20) || (block & (block - 1)) != 0)
    fail("{}: key '{}' = {} is not a power of two in [2, 2^20]", path, k("block_size"), block);
  h->block = block;

  std::string_view transform = f.get_string(k("transform"));
  if (transform != "normalized-sylvester-walsh-hadamard")
    fail("{}: key '{}' = '{}': the only supported transform is 'normalized-sylvester-walsh-hadamard'", path,
         k("transform"), transform);
  std::string_view axis = f.get_string(k("axis"));
  if (axis != "input-last-dimension")
    fail("{}: key '{}' = '{}': the only supported axis is 'input-last-dimension'", path, k("axis"), axis);

  std::string_view mode = f.get_string(k("sign_mode"));
  if (mode == "explicit") {
    h->explicit_signs = true;
    const GgufValue& widths = f.get_array(k("sign_widths"));
    if (!widths.elems || widths.is_float() || widths.elem_type == GgufType::F32 ||
        widths.elem_type == GgufType::F64 || widths.elem_type == GgufType::BOOL)
      fail("{}: key '{}' must be an integer array", path, k("sign_widths"));
    const GgufValue& values = f.get_array(k("sign_values"));
    if (!values.elems || values.elem_type == GgufType::BOOL)
      fail("{}: key '{}' must be a numeric array (int8/int16/int32/float32)", path, k("sign_values"));
    // The widths must add up to the number of values. Summed with a bound on
    // each step: a plain uint64 sum of hostile widths can wrap around to the
    // value count, after which a sign vector of 2^63 floats would be allocated.
    uint64_t total = 0;
    std::set<int64_t> seen;
    for (uint64_t i = 0; i < widths.count; ++i) {
      int64_t w = widths.elem_i64(i);
      if (w <= 0) fail("{}: key '{}': width #{} = {} must be positive", path, k("sign_widths"), i, w);
      if (!seen.insert(w).second) fail("{}: key '{}': width {} is listed twice", path, k("sign_widths"), w);
      if (static_cast<uint64_t>(w) > values.count - total)
        fail("{}: key '{}' has {} values but '{}' add up to more (through width #{} = {})", path,
             k("sign_values"), values.count, k("sign_widths"), i, w);
      total += static_cast<uint64_t>(w);
    }
    if (total != values.count)
      fail("{}: key '{}' has {} values but '{}' add up to {}", path, k("sign_values"), values.count,
           k("sign_widths"), total);
    uint64_t at = 0;
    for (uint64_t i = 0; i < widths.count; ++i) {
      int64_t w = widths.elem_i64(i);
      std::vector<float> s(static_cast<size_t>(w));
      for (int64_t j = 0; j < w; ++j, ++at) {
        double v = values.elem_f64(at);
        if (v != 1.0 && v != -1.0)
          fail("{}: key '{}': value #{} (width {}, index {}) is {}, every sign must be exactly +1 or -1",
               path, k("sign_values"), at, w, j, v);
        s[j] = static_cast<float>(v);
      }
      h->signs.emplace(w, std::move(s));
    }
  } else if (mode == "identity") {
    h->explicit_signs = false;
  } else {
    fail("{}: key '{}' = '{}': expected 'explicit' or 'identity'", path, k("sign_mode"), mode);
  }

  for (auto& n : string_array(f, k("weight_names"))) {
    if (h->folded.count(n)) fail("{}: key '{}' lists '{}' twice", path, k("weight_names"), n);
    h->folded.insert(n);
  }
  for (auto& n : string_array(f, k("inverse_weight_names"))) {
    if (n != "token_embd.weight")
      fail("{}: key '{}' lists '{}': only token_embd.weight may be inverse-rotated", path,
           k("inverse_weight_names"), n);
    h->inverse.insert(n);
  }
  if (!f.has(k("gdn_v_grouped")))
    fail("{}: missing metadata key '{}' (needed to know the ssm_out column order)", path, k("gdn_v_grouped"));
  h->gdn_v_grouped = f.get_bool(k("gdn_v_grouped"));
  if (f.has(k("tied_output"))) {
    h->tied_output = f.get_bool(k("tied_output"));
    if (h->tied_output && h->version < 2)
      fail("{}: key '{}' = true needs {} >= 2 (found {})", path, k("tied_output"), k("version"), h->version);
  }
  return h;
}

void HadamardSpec::validate_against(const GgufFile& f, const ModelConfig& c) const {
  const std::string& path = f.path();
  for (const auto& name : folded)
    if (!f.find_tensor(name))
      fail("{}: key '{}' lists '{}', which is not a tensor in the file", path, k("weight_names"), name);
  for (const auto& name : inverse)
    if (!f.find_tensor(name))
      fail("{}: key '{}' lists '{}', which is not a tensor in the file", path, k("inverse_weight_names"),
           name);
  if (!inverse.count("token_embd.weight"))
    fail("{}: key '{}' must list token_embd.weight (the embedding of a folded model is inverse-rotated)",
         path, k("inverse_weight_names"));

  // Which tensors of the graph are folded linears: exactly these must be listed.
  std::set<int64_t> widths;
  for (const TensorSpec& s : tensor_inventory(c)) {
    if (s.role != TensorRole::Folded) {
      if (folded.count(s.name))
        fail("{}: key '{}' lists '{}', which is not a linear the rotation can be folded into", path,
             k("weight_names"), s.name);
      continue;
    }
    if (!folded.count(s.name))
      fail("{}: key '{}' does not list '{}': a rotated model must fold every ternary linear", path,
           k("weight_names"), s.name);
    widths.insert(static_cast<int64_t>(s.ne[0]));
  }
  widths.insert(c.n_embd);  // embedding inverse and (tied) head
  if (c.tied_output) {
    if (version < 2 || !tied_output)
      fail(
          "{}: the model has no output.weight (tied head) but '{}' is not true with {} = 2; a folded tied "
          "head "
          "cannot be used without it",
          path, k("tied_output"), k("version"));
  } else if (tied_output) {
    fail("{}: key '{}' is true but the file has an output.weight tensor", path, k("tied_output"));
  }
  for (int64_t w : widths) {
    if (w % block != 0)
      fail("{}: key '{}' = {} does not divide the folded input width {}", path, k("block_size"), block, w);
    if (explicit_signs && !signs.count(w))
      fail("{}: key '{}' has no sign vector of width {} (a folded input width)", path, k("sign_widths"), w);
  }
}

}  // namespace bonsai
