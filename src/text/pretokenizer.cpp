#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "bonsai/error.h"
#include "bonsai/tokenizer.h"

namespace bonsai::text {
namespace {

// llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN35: Qwen2's regex with combining marks
// (\p{M}) kept inside words instead of being split off as punctuation.
constexpr const char* kQwen35 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// llama.cpp's LLAMA_VOCAB_PRE_TYPE_QWEN2 (case-insensitive contractions spelled
// out, as llama.cpp does).
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

struct MatchData {
  pcre2_match_data* md;
  explicit MatchData(pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {}
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
};

}  // namespace

const char* PreTokenizer::regex_for(std::string_view pre) {
  if (pre == "qwen35") return kQwen35;
  if (pre == "qwen2") return kQwen2;
  return nullptr;
}

PreTokenizer::PreTokenizer(std::string_view pre, const std::string& path) {
  const char* re = regex_for(pre);
  if (!re) {
    std::string list;
    for (auto s : Tokenizer::kSupportedPre) list += fmt::format("{}{}", list.empty() ? "" : ", ", s);
    fail("{}: tokenizer.ggml.pre is '{}'; supported pre-tokenizers: {}", path, pre, list);
  }
  int err = 0;
  PCRE2_SIZE off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(re), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    fail("{}: cannot compile the '{}' pre-tokenizer regex at offset {}: {}", path, pre, off,
         reinterpret_cast<const char*>(buf));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::~PreTokenizer() { pcre2_code_free(as_code(code_)); }

void PreTokenizer::split(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (text.empty()) return;
  pcre2_code* code = as_code(code_);
  MatchData m(code);
  if (!m.md) throw std::bad_alloc();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t covered = 0;  // end of the last piece emitted
  while (pos < text.size()) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, m.md, nullptr)
                        : pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, m.md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(rc, buf, sizeof buf);
      fail("pre-tokenizer: regex match failed: {}", reinterpret_cast<const char*>(buf));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.md);
    const size_t b = ov[0], e = ov[1];
    // As llama.cpp: text the regex skipped becomes a piece of its own.
    if (b > covered) out.emplace_back(covered, b - covered);
    if (e > b) {
      out.emplace_back(b, e - b);
      covered = e;
      pos = e;
    } else {
      // Empty match (the built-in patterns cannot produce one): step one character.
      pos = b + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (covered < text.size()) out.emplace_back(covered, text.size() - covered);
}

}  // namespace bonsai::text
