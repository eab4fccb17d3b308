#include "text_cli.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "text/utf8.h"

namespace bonsai::cli {

std::string read_text_file(const std::string& path, std::string_view flag) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) usage_fail("{} {}: no such file", flag, path);
  std::ifstream in(path, std::ios::binary);
  if (!in) usage_fail("{} {}: cannot open the file", flag, path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) usage_fail("{} {}: read error", flag, path);
  return ss.str();
}

void require_model_file(const std::string& path) {
  std::error_code ec;
  if (path.empty()) usage_fail("-m/--model: no model file given");
  if (!std::filesystem::exists(path, ec)) usage_fail("-m/--model {}: no such file", path);
  if (!std::filesystem::is_regular_file(path, ec)) usage_fail("-m/--model {}: not a regular file", path);
}

std::string escape_piece(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int n = text::utf8_sequence(s.substr(i));
    if (n <= 0) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
    } else if (n == 1) {
      switch (c) {
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\'':
          out += "\\'";
          break;
        default:
          if (c < 0x20 || c == 0x7F) {
            out += fmt::format("\\x{:02x}", c);
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace bonsai::cli
