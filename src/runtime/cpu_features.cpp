#include "runtime/cpu_features.h"

#include <cctype>
#include <cstdlib>
#include <string>

#include "bonsai/error.h"
#include "runtime/env.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define BONSAI_X86 1
#endif

namespace bonsai {
namespace {

#ifdef BONSAI_X86
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv with ecx = 0; encoded as bytes so no -mxsave flag is needed.
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#ifdef BONSAI_X86
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  f.fma = (c >> 12) & 1;
  f.f16c = (c >> 29) & 1;
  const bool avx = (c >> 28) & 1;
  if (osxsave && avx) {
    const uint64_t xcr0 = read_xcr0();
    f.os_avx = (xcr0 & 0x6) == 0x6;                   // SSE + YMM state
    f.os_avx512 = f.os_avx && (xcr0 & 0xE0) == 0xE0;  // opmask + ZMM_Hi256 + Hi16_ZMM
  }
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    f.avx2 = (b >> 5) & 1;
    f.avx512f = (b >> 16) & 1;
    f.avx512dq = (b >> 17) & 1;
    f.avx512bw = (b >> 30) & 1;
    f.avx512vl = (b >> 31) & 1;
    f.avx512vnni = (c >> 11) & 1;
  }
#endif
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = detect();
  return f;
}

bool isa_supported(Isa isa, const CpuFeatures& f) {
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return f.os_avx && f.avx2 && f.fma && f.f16c;
    case Isa::Avx512:
      return isa_supported(Isa::Avx2, f) && f.os_avx512 && f.avx512f && f.avx512bw && f.avx512vl &&
             f.avx512dq && f.avx512vnni;
  }
  return false;
}

Isa best_isa(const CpuFeatures& f) {
  if (isa_supported(Isa::Avx512, f)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2, f)) return Isa::Avx2;
  return Isa::Scalar;
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return "scalar";
    case Isa::Avx2:
      return "avx2";
    case Isa::Avx512:
      return "avx512";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view s) {
  std::string lower(s);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "scalar") return Isa::Scalar;
  if (lower == "avx2") return Isa::Avx2;
  if (lower == "avx512") return Isa::Avx512;
  return std::nullopt;
}

Isa select_isa(std::optional<Isa> requested) {
  const char* source = "requested";
  if (!requested) {
    // Case-insensitive, as --isa (parse_isa); hence not env_choice.
    const std::string_view env = env_value("BONSAI_ISA");
    if (!env.empty()) {
      requested = parse_isa(env);
      if (!requested) env_refuse("BONSAI_ISA", env, "scalar, avx2 or avx512");
      source = "BONSAI_ISA";
    }
  }
  if (!requested) return best_isa();
  if (!isa_supported(*requested))
    fail("{} instruction set '{}' is not supported by this CPU (best available: {})", source,
         isa_name(*requested), isa_name(best_isa()));
  return *requested;
}

}  // namespace bonsai
