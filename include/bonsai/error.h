// bonsai::Error — the one exception type the library throws for bad input.
//
// Every failure caused by a file or a user value (malformed GGUF, missing key,
// inconsistent Hadamard metadata, out-of-range CLI value) is reported as one
// Error whose message names the file and the offending key/tensor/field. The
// CLI catches it once at the top, prints `error: <what()>` and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace bonsai {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

// A bad command-line value (out of range, empty prompt, missing file given on
// the command line): the CLI exits with code 2 instead of 1.
class UsageError : public Error {
 public:
  explicit UsageError(std::string message) : Error(std::move(message)) {}
};

template <typename... Args>
[[noreturn]] void usage_fail(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

// fail("{}: key '{}' ...", path, key) — formats and throws bonsai::Error.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace bonsai
