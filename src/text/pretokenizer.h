// The pre-tokenizer: splits text into the pieces BPE merges within, with the
// regex named by tokenizer.ggml.pre, compiled once with PCRE2 (UTF + Unicode
// properties, JIT when available).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bonsai::text {

class PreTokenizer {
 public:
  // Throws bonsai::Error (naming `path` and the key) for an unknown `pre`.
  PreTokenizer(std::string_view pre, const std::string& path);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Appends the pieces of `text` (valid UTF-8) as (offset, length) byte
  // ranges covering the whole text in order. Thread-safe.
  void split(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  static const char* regex_for(std::string_view pre);  // nullptr when unknown

 private:
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace bonsai::text
