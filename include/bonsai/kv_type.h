// Element type of the full-attention layers' KV cache (bonsai's -ctk / -ctv, as in llama.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace bonsai {

// F32: the reference's type; attention reads the rows exactly as RoPE / the projection wrote them.
// F16: IEEE binary16, rounded to nearest even when a row is stored (values beyond ±65504 become
// ±inf, as in llama.cpp's f16 cache); every backend converts each element back to f32 before it
// is used, so attention over an F16 cache equals attention over an F32 cache holding the rounded
// rows. Half the memory and half the bytes a long decode step streams.
enum class KvType : uint8_t { F32 = 0, F16 = 1 };

constexpr size_t kv_type_bytes(KvType t) { return t == KvType::F16 ? 2 : 4; }
std::string_view kv_type_name(KvType t);  // "f32" / "f16"
// Parses "f32" / "f16" (case-insensitive); throws UsageError naming `what` and the valid values.
KvType parse_kv_type(std::string_view s, std::string_view what);

}  // namespace bonsai
