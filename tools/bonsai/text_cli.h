// Helpers shared by the text commands (tokenize, run, chat).
#pragma once

#include <string>
#include <string_view>

namespace bonsai::cli {

// Reads a whole file verbatim (bytes); a missing or unreadable file is a
// UsageError naming `flag`.
std::string read_text_file(const std::string& path, std::string_view flag);
// A token piece for display: printable UTF-8 as is; control characters,
// quotes/backslashes and bytes that are not valid UTF-8 escaped (\n, \t, \xNN).
std::string escape_piece(std::string_view bytes);
// Throws UsageError when `path` does not name an existing regular file.
void require_model_file(const std::string& path);

}  // namespace bonsai::cli
