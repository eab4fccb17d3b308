// Format checks `bonsai inspect` reports: Q2_0 layouts, Hadamard metadata
// consistency, whether the file is a runnable model, tokenizer presence.
#pragma once

#include <string>
#include <vector>

#include "bonsai/gguf.h"

namespace bonsai::cli {
std::vector<std::string> inspect_checks(const GgufFile& f);
}
