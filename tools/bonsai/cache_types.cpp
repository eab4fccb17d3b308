// -ctk / -ctv: the KV cache element type, shared by run, chat, gate and bench.
#include "bonsai/error.h"
#include "commands.h"

namespace bonsai::cli {

void add_cache_type_options(CLI::App* cmd, std::string& k, std::string& v) {
  cmd->add_option("--cache-type-k", k, "KV cache type for K, also -ctk: f32 | f16 (f16 halves the cache)")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", v, "KV cache type for V, also -ctv: f32 | f16 (the same type as K)")
      ->capture_default_str();
}

KvType parse_kv_types(const std::string& k, const std::string& v) {
  const KvType tk = parse_kv_type(k, "-ctk/--cache-type-k"), tv = parse_kv_type(v, "-ctv/--cache-type-v");
  if (tk != tv)
    usage_fail(
        "-ctk/--cache-type-k is {} but -ctv/--cache-type-v is {}: K and V must have the same type "
        "(f32 or f16)",
        kv_type_name(tk), kv_type_name(tv));
  return tk;
}

}  // namespace bonsai::cli
