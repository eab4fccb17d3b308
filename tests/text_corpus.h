// Deterministic "mixed" text for tokenizer tests and benchmarks: English-like
// words, numbers, punctuation, code, CJK, Cyrillic, accented Latin, emoji and
// whitespace runs, so that a per-call word cache sees realistic repetition
// rather than one repeated paragraph. Paragraphs start with an ASCII letter
// and end with '\n'; that is always a pre-token boundary (no regex
// alternative spans "\n" followed by a letter), so the ids of the whole text
// equal the concatenated ids of its paragraphs.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace bonsai::testing {

inline void append_cp(std::string& s, uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Paragraphs totalling at least `bytes` bytes.
inline std::vector<std::string> mixed_paragraphs(size_t bytes, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  static const char* syl[] = {"ka",  "ther", "in",  "on",  "ex", "pre", "str",  "ing",
                              "al",  "ment", "ous", "qu",  "ly", "re",  "tion", "ab",
                              "ver", "sh",   "oo",  "ick", "de", "com", "pro",  "est"};
  static const char* punct[] = {". ", ", ", "; ", ": ",  "! ",  "? ",  " - ",
                                " (", ") ", "\"", "'s ", "'t ", "...", " & "};
  static const char* code[] = {"    return x + 1;\n",
                               "for (int i = 0; i < n; ++i) {\n",
                               "}\n",
                               "def f(a, b):\n",
                               "\tif (p != nullptr) p->next = q;\n",
                               "x = {'k': [1, 2.5e-3]}\n",
                               "#include <vector>\n",
                               "  // TODO: fix\n"};
  static const char* latin[] = {"café", "naïve", "über", "Ångström", "résumé", "señor", "façade", "Straße"};
  static const char* cyr[] = {"привет", "мир", "текст", "Български", "русский", "язык"};
  std::vector<std::string> paras;
  size_t total = 0;
  while (total < bytes) {
    std::string p(1, static_cast<char>('A' + pick(26)));
    const size_t items = 20 + pick(120);
    for (size_t i = 0; i < items; ++i) {
      const size_t kind = pick(100);
      if (kind < 55) {  // an English-like word
        const size_t ns = 1 + pick(4);
        for (size_t k = 0; k < ns; ++k) p += syl[pick(std::size(syl))];
        p += ' ';
      } else if (kind < 65) {
        p += punct[pick(std::size(punct))];
      } else if (kind < 71) {
        p += std::to_string(rng() % 100000);
        p += pick(2) ? " " : ".";
      } else if (kind < 77) {
        p += code[pick(std::size(code))];
      } else if (kind < 83) {  // CJK run
        const size_t n = 1 + pick(6);
        for (size_t k = 0; k < n; ++k) append_cp(p, 0x4E00 + static_cast<uint32_t>(pick(0x5000)));
        if (pick(2)) append_cp(p, 0x3002);
      } else if (kind < 88) {
        p += cyr[pick(std::size(cyr))];
        p += ' ';
      } else if (kind < 93) {
        p += latin[pick(std::size(latin))];
        p += ' ';
      } else if (kind < 96) {  // emoji, sometimes joined
        append_cp(p, 0x1F600 + static_cast<uint32_t>(pick(80)));
        if (pick(3) == 0) {
          append_cp(p, 0x200D);
          append_cp(p, 0x1F680 + static_cast<uint32_t>(pick(40)));
        }
        p += ' ';
      } else {  // whitespace runs
        static const char* ws[] = {"  ", "\t", "   \t ", "\n\n", " \n", "\r\n"};
        p += ws[pick(std::size(ws))];
      }
    }
    p += '\n';
    total += p.size();
    paras.push_back(std::move(p));
  }
  return paras;
}

}  // namespace bonsai::testing
