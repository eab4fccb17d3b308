#include "bonsai/kv_type.h"

#include <algorithm>
#include <cctype>

#include "bonsai/error.h"

namespace bonsai {

std::string_view kv_type_name(KvType t) { return t == KvType::F16 ? "f16" : "f32"; }

KvType parse_kv_type(std::string_view s, std::string_view what) {
  std::string lower(s);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "f32") return KvType::F32;
  if (lower == "f16") return KvType::F16;
  usage_fail("{}: '{}' is not a KV cache type; valid: f32, f16", what, s);
}

}  // namespace bonsai
