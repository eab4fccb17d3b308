// UTF-8 helpers for the tokenizer: llama.cpp's lenient decoding of raw input,
// strict validation for output, and GPT-2's byte <-> printable-char map.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace bonsai::text {

// Appends the UTF-8 encoding of `cp` (any value below 0x110000, surrogates
// included, as llama.cpp does).
void append_utf8(std::string& out, uint32_t cp);

// Re-encodes raw input the way llama.cpp's tokenizer sees it: every byte that
// does not start a decodable sequence becomes U+FFFD; overlong forms decode to
// their code point; surrogates are kept. `out` is what gets BPE-merged.
// `match` has the same length and byte boundaries as `out` but is valid UTF-8
// with the classes the pre-tokenizer regex must see: surrogates (category Cs,
// "other" to llama.cpp) become U+E000 (Co, also "other"), and U+0085 NEL,
// which llama.cpp counts as whitespace but PCRE2's \s does not, becomes
// U+00A0 (whitespace to both). Both encodings keep their byte length.
void reencode_lenient(std::string_view in, std::string& out, std::string& match);

// Length of the valid UTF-8 sequence starting at s[0] (1..4), 0 when s[0..]
// is a valid but incomplete prefix (more bytes may complete it), or -k when
// the first k bytes are a maximal invalid subpart (replace them by one U+FFFD).
int utf8_sequence(std::string_view s);

// Strict UTF-8 sanitization: complete valid characters of `bytes` are
// appended to `out`, invalid subparts become U+FFFD. When `final` is false an
// incomplete trailing character is left in `rest` instead.
void utf8_sanitize(std::string_view bytes, std::string& out, std::string& rest, bool final);

// GPT-2 byte-level alphabet: byte b <-> code point byte_to_cp()[b].
const std::array<uint32_t, 256>& byte_to_cp();
// Inverse, for code points < 324; -1 when cp is not one of the 256.
int cp_to_byte(uint32_t cp);

}  // namespace bonsai::text
