// -ctk / -ctv: the KV cache element type, shared by run, chat, gate and bench.
#include "bonsai/error.h"
#include "commands.h"

namespace bonsai::cli {

void add_cache_type_options(CLI::App* cmd, std::string& k, std::string& v) {
  cmd->add_option("--cache-type-k", k,
                  "KV cache type for K, also -ctk: auto | f32 | f16 (f16 halves the cache; auto: f16 on "
                  "cuda, as llama.cpp, f32 on ref and the CPU paths)")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", v,
                  "KV cache type for V, also -ctv: auto | f32 | f16 (the same type as K)")
      ->capture_default_str();
}

std::optional<KvType> parse_kv_types(const std::string& k, const std::string& v) {
  auto one = [](const std::string& s, std::string_view what) -> std::optional<KvType> {
    if (s == "auto") return std::nullopt;
    if (s != "f32" && s != "f16" && s != "F32" && s != "F16")
      usage_fail("{}: '{}' is not a KV cache type; valid: auto, f32, f16", what, s);
    return parse_kv_type(s, what);
  };
  const auto tk = one(k, "-ctk/--cache-type-k"), tv = one(v, "-ctv/--cache-type-v");
  // One side given: the other follows it (llama.cpp users often pass -ctk alone).
  if (!tk || !tv) return tk ? tk : tv;
  if (*tk != *tv)
    usage_fail(
        "-ctk/--cache-type-k is {} but -ctv/--cache-type-v is {}: K and V must have the same type "
        "(f32 or f16)",
        kv_type_name(*tk), kv_type_name(*tv));
  return tk;
}

}  // namespace bonsai::cli
