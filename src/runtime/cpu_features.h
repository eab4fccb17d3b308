// Run-time CPU feature detection and SIMD level selection.
//
// Kernels exist at three levels: Scalar (portable C++, the same quantized math
// as the SIMD code), Avx2 (AVX2 + FMA + F16C, the x86 baseline) and Avx512
// (AVX-512 F/BW/VL/DQ + VNNI). The level is chosen at run time: an explicit
// request wins, then the environment variable BONSAI_ISA=scalar|avx2|avx512,
// then the best level the CPU and OS support. Asking for a level the machine
// cannot run is an error, never a silent downgrade, so a forced test run
// really exercises what it names.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace bonsai {

enum class Isa : uint8_t { Scalar, Avx2, Avx512 };

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512vnni = false;
  bool os_avx = false;     // XCR0 enables the YMM state
  bool os_avx512 = false;  // XCR0 enables the opmask and ZMM states
};

// Detected once (cpuid + xgetbv) and cached in a function-local static.
const CpuFeatures& cpu_features();

// Whether this CPU (and OS) can run kernels of the given level.
bool isa_supported(Isa isa, const CpuFeatures& f = cpu_features());
// The highest supported level.
Isa best_isa(const CpuFeatures& f = cpu_features());

std::string_view isa_name(Isa isa);
// "scalar" | "avx2" | "avx512" (case-insensitive); nullopt for anything else.
std::optional<Isa> parse_isa(std::string_view s);

// The level kernels should use: `requested` if given, else $BONSAI_ISA if set,
// else best_isa(). Throws bonsai::Error if the chosen level is unsupported or
// the environment value is not a level name.
Isa select_isa(std::optional<Isa> requested = std::nullopt);

}  // namespace bonsai
