// Synthetic GPT-2 byte-level BPE vocabulary: byte tokens, merges learned from
// the built-in text (within qwen35 pre-tokens), filler, special tokens.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "bonsai/error.h"
#include "bonsai/synth.h"

namespace bonsai {
namespace {

// The qwen35 pre-tokenizer regex (fixtures/tokenizer/README.md).
constexpr const char* kQwen35Regex =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

// Splits UTF-8 text into qwen35 pre-tokens; merges are learned within them.
std::vector<std::string> pretokenize(std::string_view text) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  std::unique_ptr<pcre2_code, CodeDeleter> re(pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kQwen35Regex),
                                                            PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                                                            &err, &err_off, nullptr));
  if (!re)
    fail("synth vocab: cannot compile the qwen35 pre-tokenizer regex (pcre2 error {} at {})", err, err_off);
  std::unique_ptr<pcre2_match_data, MatchDeleter> md(pcre2_match_data_create_from_pattern(re.get(), nullptr));
  std::vector<std::string> out;
  size_t at = 0;
  while (at < text.size()) {
    const int rc = pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, 0,
                               md.get(), nullptr);
    if (rc < 0) {  // cannot happen: some alternative matches any character
      out.emplace_back(text.substr(at));
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    if (ov[0] > at) out.emplace_back(text.substr(at, ov[0] - at));  // unmatched gap, kept whole
    if (ov[1] == ov[0]) fail("synth vocab: the pre-tokenizer regex matched an empty piece at byte {}", ov[0]);
    out.emplace_back(text.substr(ov[0], ov[1] - ov[0]));
    at = ov[1];
  }
  return out;
}

bool printable_byte(int b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

struct Word {
  std::vector<int32_t> sym;  // token ids
  int64_t count;             // occurrences of the pre-token in the text
};

}  // namespace

std::string byte_to_unicode(uint8_t b) {
  if (printable_byte(b)) return utf8(b);
  uint32_t n = 0;  // non-printable bytes map, in byte order, to 256, 257, ...
  for (int x = 0; x < b; ++x) n += !printable_byte(x);
  return utf8(256 + n);
}

SynthVocab build_synth_vocab(uint32_t n_vocab) {
  if (n_vocab < kSynthMinVocab)
    fail("synth vocab: n_vocab {} is below the minimum {} (256 byte tokens + 5 special tokens)", n_vocab,
         kSynthMinVocab);
  SynthVocab v;
  std::unordered_map<std::string, int32_t> id_of;
  auto add = [&](std::string s, int32_t type) {
    const auto id = static_cast<int32_t>(v.tokens.size());
    if (!id_of.emplace(s, id).second) fail("synth vocab: duplicate token '{}'", s);
    v.tokens.push_back(std::move(s));
    v.types.push_back(type);
    return id;
  };
  // Byte tokens in GPT-2 order: printable bytes first (ids 0..187), then the rest.
  int32_t byte_id[256];
  for (int pass = 0; pass < 2; ++pass)
    for (int b = 0; b < 256; ++b)
      if (printable_byte(b) == (pass == 0)) byte_id[b] = add(byte_to_unicode(static_cast<uint8_t>(b)), 1);

  const uint32_t n_regular = n_vocab - 5;
  std::map<std::string, int64_t> freq;  // ordered: word order, hence ties, are deterministic
  for (const std::string& p : pretokenize(synth_training_text())) ++freq[p];
  std::vector<Word> words;
  for (const auto& [piece, n] : freq) {
    Word w{{}, n};
    for (unsigned char ch : piece) w.sym.push_back(byte_id[ch]);
    if (w.sym.size() > 1) words.push_back(std::move(w));
  }
  // Plain BPE training: merge the most frequent adjacent pair (ties: smaller
  // left id, then smaller right id) until the vocab is full or no pair is left.
  // Pair counts are kept up to date incrementally: only the words holding the
  // merged pair are recounted (same result as recounting everything).
  std::unordered_map<uint64_t, int64_t> pairs;
  auto pair_key = [](int32_t x, int32_t y) {
    return (uint64_t{static_cast<uint32_t>(x)} << 32) | static_cast<uint32_t>(y);
  };
  auto count_word = [&](const Word& w, int64_t sign) {
    for (size_t i = 0; i + 1 < w.sym.size(); ++i) {
      const uint64_t key = pair_key(w.sym[i], w.sym[i + 1]);
      if ((pairs[key] += sign * w.count) == 0) pairs.erase(key);
    }
  };
  for (const Word& w : words) count_word(w, 1);
  while (v.tokens.size() < n_regular && !pairs.empty()) {
    uint64_t best = 0;
    int64_t best_n = -1;
    for (const auto& [key, n] : pairs)
      if (n > best_n || (n == best_n && key < best)) {
        best = key;
        best_n = n;
      }
    const auto a = static_cast<int32_t>(best >> 32), b = static_cast<int32_t>(best & 0xffffffffu);
    v.merges.push_back(v.tokens[a] + " " + v.tokens[b]);
    // Two merge paths can spell the same string ("ab c" / "a bc"): the merge
    // then maps to the existing token and the vocab does not grow.
    std::string merged = v.tokens[a] + v.tokens[b];
    const auto it = id_of.find(merged);
    int32_t id;
    if (it != id_of.end()) {
      id = it->second;
    } else {
      id = add(std::move(merged), 1);
      ++v.n_learned;
    }
    for (Word& w : words) {
      bool has = false;
      for (size_t i = 0; i + 1 < w.sym.size() && !has; ++i) has = w.sym[i] == a && w.sym[i + 1] == b;
      if (!has) continue;
      count_word(w, -1);
      size_t o = 0;
      for (size_t i = 0; i < w.sym.size(); ++i) {
        if (i + 1 < w.sym.size() && w.sym[i] == a && w.sym[i + 1] == b) {
          w.sym[o++] = id;
          ++i;
        } else {
          w.sym[o++] = w.sym[i];
        }
      }
      w.sym.resize(o);
      count_word(w, 1);
    }
    std::erase_if(words, [](const Word& w) { return w.sym.size() < 2; });
  }
  // The text ran out of pairs: distinct filler tokens no merge produces (the
  // qwen35 pre-tokenizer splits digits one by one, so no learned token holds
  // two digits; add() still checks uniqueness).
  while (v.tokens.size() < n_regular) {
    add(fmt::format("filler_{:06}", v.n_filler), 1);
    ++v.n_filler;
  }
  v.bos_id = static_cast<uint32_t>(add("<|endoftext|>", 3));
  v.im_start_id = static_cast<uint32_t>(add("<|im_start|>", 3));
  v.eos_id = static_cast<uint32_t>(add("<|im_end|>", 3));
  add("<think>", 4);
  add("</think>", 4);
  return v;
}

std::string_view synth_chat_template() {
  // Qwen3-style ChatML without tools: system/user/assistant turns between
  // <|im_start|>role\n ... <|im_end|>\n; assistant reasoning in a think block;
  // the generation prompt opens an assistant turn and its think block, like
  // Qwen3.5 ("<think>\n"; an empty block when enable_thinking is false).
  static constexpr std::string_view kTemplate = R"TPL({%- for message in messages %}
    {%- if message.role == "assistant" %}
        {%- if message.reasoning_content is defined and message.reasoning_content %}
            {{- '<|im_start|>assistant\n<think>\n' + message.reasoning_content + '\n</think>\n\n' + message.content + '<|im_end|>\n' }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + message.content + '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %})TPL";
  return kTemplate;
}

}  // namespace bonsai
