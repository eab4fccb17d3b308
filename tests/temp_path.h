// Paths for the files tests write. Several test binaries may run at once (ctest -j, two
// checkouts on one machine, CI next to a developer's run), so a fixed name in the shared temp
// directory lets one run truncate another's file mid-read: every name carries the process id.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <string_view>

namespace bonsai::testing {

// <temp dir>/bonsai_<pid>_<name>; `name` is unique within one test binary.
inline std::filesystem::path unique_temp_path(std::string_view name) {
  return std::filesystem::temp_directory_path() /
         ("bonsai_" + std::to_string(::getpid()) + "_" + std::string(name));
}

}  // namespace bonsai::testing
