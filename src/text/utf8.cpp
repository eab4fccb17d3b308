#include "text/utf8.h"

namespace bonsai::text {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

bool is_cont(uint8_t c) { return (c & 0xC0) == 0x80; }

// llama.cpp's unicode_cpt_from_utf8: only the lead byte's length bits and the
// continuation tags are checked (overlong forms and surrogates pass). Returns
// false for an undecodable position. Code points above U+10FFFF (leads
// F5..F7, F4 9x..) would make llama.cpp throw later; they are treated as
// undecodable here.
bool decode_lenient(std::string_view s, size_t i, uint32_t& cp, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const uint8_t c = b(0);
  const size_t left = s.size() - i;
  if (!(c & 0x80)) {
    cp = c;
    len = 1;
    return true;
  }
  if (!(c & 0x40)) return false;
  if (!(c & 0x20)) {
    if (left < 2 || !is_cont(b(1))) return false;
    cp = ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    len = 2;
    return true;
  }
  if (!(c & 0x10)) {
    if (left < 3 || !is_cont(b(1)) || !is_cont(b(2))) return false;
    cp = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    len = 3;
    return true;
  }
  if (!(c & 0x08)) {
    if (left < 4 || !is_cont(b(1)) || !is_cont(b(2)) || !is_cont(b(3))) return false;
    cp = ((c & 0x07u) << 18) | ((b(1) & 0x3Fu) << 12) | ((b(2) & 0x3Fu) << 6) | (b(3) & 0x3Fu);
    len = 4;
    return cp <= 0x10FFFF;
  }
  return false;
}

}  // namespace

void reencode_lenient(std::string_view in, std::string& out, std::string& match) {
  out.clear();
  match.clear();
  out.reserve(in.size());
  match.reserve(in.size());
  size_t i = 0;
  while (i < in.size()) {
    // Fast path: ASCII runs are unchanged.
    if (!(static_cast<uint8_t>(in[i]) & 0x80)) {
      out += in[i];
      match += in[i];
      ++i;
      continue;
    }
    uint32_t cp = 0;
    size_t len = 0;
    if (!decode_lenient(in, i, cp, len)) {
      cp = 0xFFFD;
      len = 1;
    }
    i += len;
    append_utf8(out, cp);
    if (cp >= 0xD800 && cp <= 0xDFFF) {
      append_utf8(match, 0xE000);
    } else if (cp == 0x85) {
      append_utf8(match, 0xA0);
    } else {
      append_utf8(match, cp);
    }
  }
}

int utf8_sequence(std::string_view s) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(0);
  if (c < 0x80) return 1;
  int n = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // valid range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    if (static_cast<size_t>(k) >= s.size()) return 0;  // valid so far, incomplete
    const uint8_t x = b(k);
    const bool ok = k == 1 ? (x >= lo && x <= hi) : is_cont(x);
    if (!ok) return -k;
  }
  return n;
}

void utf8_sanitize(std::string_view bytes, std::string& out, std::string& rest, bool final) {
  rest.clear();
  size_t i = 0;
  while (i < bytes.size()) {
    const int n = utf8_sequence(bytes.substr(i));
    if (n > 0) {
      out.append(bytes.substr(i, n));
      i += n;
    } else if (n < 0) {
      out += "\xEF\xBF\xBD";
      i += -n;
    } else if (final) {
      out += "\xEF\xBF\xBD";  // incomplete trailing character
      i = bytes.size();
    } else {
      rest.assign(bytes.substr(i));
      i = bytes.size();
    }
  }
}

namespace {
struct ByteMap {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};
  ByteMap() {
    to_byte.fill(-1);
    uint32_t n = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : 256 + n++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};
// Immutable after construction (a function-local constant, not mutable state).
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::array<uint32_t, 256>& byte_to_cp() { return byte_map().to_cp; }

int cp_to_byte(uint32_t cp) { return cp < 324 ? byte_map().to_byte[cp] : -1; }

}  // namespace bonsai::text
