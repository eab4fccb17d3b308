// Tokenizer: GGUF vocabulary loading, special-token partition and byte-level
// BPE. The semantics follow llama.cpp's llm_tokenizer_bpe (see tokenizer.h);
// the data structures are chosen for speed: merges are keyed by the pair of
// symbol ids (not strings), and each encode() call caches the ids of every
// distinct pre-token it has already merged.
#include "bonsai/tokenizer.h"

#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace bonsai {
namespace {

using text::PreTokenizer;

// Open-addressing hash map (symbol pair -> merge). 151k merges are looked up
// several times per pre-token, so this avoids std::unordered_map's node hops.
class PairMap {
 public:
  struct Merge {
    int32_t rank = -1;
    int32_t result = -1;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap <<= 1;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Merge{});
    mask_ = cap - 1;
  }
  // Keeps the first insertion of a key (llama.cpp's bpe_ranks.emplace).
  void insert_first(uint64_t key, Merge m) {
    size_t i = slot(key);
    if (keys_[i] == key) return;
    keys_[i] = key;
    vals_[i] = m;
  }
  const Merge* find(uint64_t key) const {
    const size_t i = slot(key);
    return keys_[i] == key ? &vals_[i] : nullptr;
  }
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  size_t slot(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    size_t i = static_cast<size_t>(h >> 20) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    return i;
  }
  std::vector<uint64_t> keys_;
  std::vector<Merge> vals_;
  size_t mask_ = 0;
};

// Tokens llama.cpp forces to control type by their text (end-of-generation and
// fill-in-the-middle markers), whatever the file says.
constexpr std::string_view kForcedControl[] = {
    "<|eot_id|>",      "<|im_end|>",         "<|end|>",        "<|return|>",     "<|call|>",
    "<end_of_turn>",   "<|endoftext|>",      "<|eom_id|>",     "<EOT>",          "_<EOT>",
    "<|end_of_text|>", "<end_of_utterance>", "<|fim_prefix|>", "<fim-prefix>",   "<fim_prefix>",
    "<|fim_suffix|>",  "<fim-suffix>",       "<fim_suffix>",   "<|fim_middle|>", "<fim-middle>",
    "<fim_middle>",    "<|fim_pad|>",        "<fim-pad>",      "<fim_pad>",      "<|fim_repo|>",
    "<|repo_name|>",   "<fim-repo>",         "<reponame>",     "<|file_sep|>",   "<fim-sep>",
    "<file_sep>"};

}  // namespace

struct Tokenizer::Impl {
  std::vector<std::string> tokens;  // [n_vocab] vocabulary strings
  std::vector<TokenType> types;     // [n_vocab]
  std::vector<std::string> pieces;  // [n_vocab] bytes of a normal token (byte-level decoded)
  std::unordered_map<std::string_view, int32_t> text_to_id;  // views into `tokens`; last id wins
  // BPE symbol space: ids < n_vocab are vocabulary tokens; ids >= n_vocab name
  // strings that only occur in merges (never in well-formed files), kept so a
  // merge chain through them behaves as llama.cpp's string-based merging.
  std::vector<std::string> virtual_text;
  std::array<int32_t, 256> byte_sym{};  // symbol of each single byte
  PairMap merges;
  std::vector<int32_t> specials;  // control / user-defined / unknown, longest text first
  std::unique_ptr<PreTokenizer> pre;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens.size()); }

  int32_t lookup(std::string_view s) const {
    auto it = text_to_id.find(s);
    return it == text_to_id.end() ? -1 : it->second;
  }

  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void encode_raw(std::string_view raw, std::vector<int32_t>& out,
                  std::unordered_map<std::string, std::vector<int32_t>>& cache) const;
};

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  struct Sym {
    int32_t id;  // -1: merged into its left neighbour
    int32_t prev, next;
  };
  struct Bigram {
    int32_t rank, left, right, lid, rid, result;
  };
  // Lowest rank first; among equal ranks the leftmost (llama.cpp's llm_bigram_bpe order).
  auto worse = [](const Bigram& a, const Bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  std::vector<Sym> syms(word.size());
  for (size_t i = 0; i < word.size(); ++i)
    syms[i] = {byte_sym[static_cast<uint8_t>(word[i])], static_cast<int32_t>(i) - 1,
               i + 1 == word.size() ? -1 : static_cast<int32_t>(i + 1)};
  std::vector<Bigram> heap;
  heap.reserve(word.size() * 2);
  auto add = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    const PairMap::Merge* m = merges.find(PairMap::key(syms[l].id, syms[r].id));
    if (!m) return;
    heap.push_back({m->rank, l, r, syms[l].id, syms[r].id, m->result});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (size_t i = 1; i < word.size(); ++i) add(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const Bigram b = heap.back();
    heap.pop_back();
    Sym& l = syms[b.left];
    Sym& r = syms[b.right];
    // Stale entry: one side was merged away or grew since it was queued.
    if (l.id != b.lid || r.id != b.rid || l.next != b.right) continue;
    l.id = b.result;
    l.next = r.next;
    if (r.next >= 0) syms[r.next].prev = b.left;
    r.id = -1;
    add(l.prev, b.left);
    add(b.left, l.next);
  }
  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const int32_t id = syms[i].id;
    if (id < n_vocab()) {
      out.push_back(id);
      continue;
    }
    // A string outside the vocabulary: llama.cpp emits the tokens of its
    // single bytes that exist in the vocabulary.
    for (char c : virtual_text[id - n_vocab()]) {
      const int32_t t = lookup(std::string_view(&c, 1));
      if (t >= 0) out.push_back(t);
    }
  }
}

void Tokenizer::Impl::encode_raw(std::string_view raw, std::vector<int32_t>& out,
                                 std::unordered_map<std::string, std::vector<int32_t>>& cache) const {
  std::string enc, match;
  text::reencode_lenient(raw, enc, match);
  std::vector<std::pair<size_t, size_t>> words;
  pre->split(match, words);
  std::string key;
  for (const auto& [off, len] : words) {
    const std::string_view w(enc.data() + off, len);
    if (len == 1) {
      const int32_t id = byte_sym[static_cast<uint8_t>(w[0])];
      if (id < n_vocab()) {
        out.push_back(id);
        continue;
      }
    }
    key.assign(w);
    auto it = cache.find(key);
    if (it == cache.end()) {
      std::vector<int32_t> ids;
      bpe(w, ids);
      it = cache.emplace(key, std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;

bool Tokenizer::has_vocab(const GgufFile& f) {
  const GgufValue* v = f.find("tokenizer.ggml.model");
  if (!v || v->type != GgufType::STRING) return false;
  return v->str != "no_vocab" && v->str != "none" && f.has("tokenizer.ggml.tokens");
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& f) {
  const std::string& path = f.path();
  if (!has_vocab(f)) fail("{}: model has no vocabulary; text commands need one", path);
  const std::string_view model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    fail("{}: tokenizer.ggml.model is '{}'; bonsai supports only 'gpt2' (byte-level BPE)", path, model);

  std::unique_ptr<Tokenizer> t(new Tokenizer());
  t->path_ = path;
  Impl& m = *t->impl_;
  const std::string_view pre = f.get_string_or("tokenizer.ggml.pre", "");
  if (pre.empty()) {
    std::string list;
    for (auto s : kSupportedPre) list += fmt::format("{}{}", list.empty() ? "" : ", ", s);
    fail("{}: key 'tokenizer.ggml.pre' is missing; supported pre-tokenizers: {}", path, list);
  }
  t->pre_ = std::string(pre);
  m.pre = std::make_unique<PreTokenizer>(pre, path);

  const GgufValue& toks = f.get_array("tokenizer.ggml.tokens", GgufType::STRING);
  if (toks.count == 0) fail("{}: key 'tokenizer.ggml.tokens' is empty", path);
  if (toks.count > 0x7FFFFFFFull) fail("{}: key 'tokenizer.ggml.tokens' has too many entries", path);
  const auto n = static_cast<int32_t>(toks.count);
  m.tokens.reserve(n);
  for (auto s : toks.strings) m.tokens.emplace_back(s);
  for (int32_t i = 0; i < n; ++i) {
    // llama.cpp names empty strings so they can never match text.
    if (m.tokens[i].empty()) m.tokens[i] = fmt::format("[EMPTY_{}]", i);
  }
  m.text_to_id.reserve(n);
  for (int32_t i = 0; i < n; ++i) m.text_to_id[m.tokens[i]] = i;

  m.types.assign(n, TokenType::Normal);
  if (const GgufValue* tt = f.find("tokenizer.ggml.token_type")) {
    if (tt->type != GgufType::ARRAY || !tt->elems || tt->count != toks.count)
      fail("{}: key 'tokenizer.ggml.token_type' must be an integer array of {} entries (one per token)", path,
           n);
    for (int32_t i = 0; i < n; ++i) {
      const int64_t v = tt->elem_i64(i);
      if (v < 0 || v > 6)
        fail("{}: key 'tokenizer.ggml.token_type' entry {} is {}; valid types are 0..6", path, i, v);
      m.types[i] = static_cast<TokenType>(v);
    }
  }
  for (auto s : kForcedControl) {
    const int32_t id = m.lookup(s);
    if (id >= 0 && m.types[id] != TokenType::Control) {
      spdlog::debug("{}: token {} '{}' is treated as a control token", path, id, s);
      m.types[id] = TokenType::Control;
    }
  }

  // Byte-level alphabet and pieces.
  std::unordered_map<std::string, int32_t> virtual_ids;
  auto sym_of = [&](std::string_view s) -> int32_t {
    const int32_t id = m.lookup(s);
    if (id >= 0) return id;
    auto [it, inserted] =
        virtual_ids.emplace(std::string(s), n + static_cast<int32_t>(m.virtual_text.size()));
    if (inserted) m.virtual_text.emplace_back(s);
    return it->second;
  };
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    text::append_utf8(ch, text::byte_to_cp()[b]);
    m.byte_sym[b] = sym_of(ch);
  }
  m.pieces.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    const TokenType ty = m.types[i];
    if (ty != TokenType::Normal && ty != TokenType::Undefined) continue;
    // Each code point of a byte-level string stands for one byte; a code point
    // outside the alphabet (malformed vocabulary) is kept as its UTF-8 text.
    const std::string& s = m.tokens[i];
    std::string& p = m.pieces[i];
    for (size_t k = 0; k < s.size();) {
      int len = text::utf8_sequence(std::string_view(s).substr(k));
      if (len <= 0) {
        p += s[k++];
        continue;
      }
      uint32_t cp = static_cast<uint8_t>(s[k]);
      if (len == 2) cp = ((cp & 0x1Fu) << 6) | (static_cast<uint8_t>(s[k + 1]) & 0x3Fu);
      const int byte = len <= 2 ? text::cp_to_byte(cp) : -1;
      if (byte >= 0) {
        p += static_cast<char>(byte);
      } else {
        p.append(s, k, len);
      }
      k += len;
    }
  }

  // Merges: "left right", split at the first space after the first byte.
  const GgufValue* mv = f.find("tokenizer.ggml.merges");
  if (!mv) fail("{}: key 'tokenizer.ggml.merges' is missing (a gpt2 tokenizer needs its BPE merges)", path);
  const GgufValue& merges = f.get_array("tokenizer.ggml.merges", GgufType::STRING);
  if (merges.count > 0x7FFFFFFFull) fail("{}: key 'tokenizer.ggml.merges' has too many entries", path);
  m.merges.reserve(merges.count);
  std::string joined;
  for (size_t i = 0; i < merges.strings.size(); ++i) {
    const std::string_view s = merges.strings[i];
    const size_t sp = s.size() > 1 ? s.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos)
      fail("{}: key 'tokenizer.ggml.merges' entry {} ('{}') is not two symbols separated by a space", path, i,
           s);
    const std::string_view a = s.substr(0, sp), b = s.substr(sp + 1);
    joined.assign(a);
    joined.append(b);
    const int32_t ia = sym_of(a), ib = sym_of(b), ir = sym_of(joined);
    m.merges.insert_first(PairMap::key(ia, ib), {static_cast<int32_t>(i), ir});
  }
  if (!m.virtual_text.empty())
    spdlog::debug("{}: {} merge symbols are not in the vocabulary", path, m.virtual_text.size());

  // Special tokens, longest first (ties by id, for a deterministic order).
  for (int32_t i = 0; i < n; ++i) {
    const TokenType ty = m.types[i];
    if (ty == TokenType::Control || ty == TokenType::UserDefined || ty == TokenType::Unknown)
      m.specials.push_back(i);
  }
  std::stable_sort(m.specials.begin(), m.specials.end(),
                   [&](int32_t a, int32_t b) { return m.tokens[a].size() > m.tokens[b].size(); });

  auto id_key = [&](const char* key, int32_t& out) {
    if (!f.has(key)) return;
    const uint64_t v = f.get_u64(key);
    if (v >= static_cast<uint64_t>(n))
      fail("{}: key '{}' is {}, outside the vocabulary (n = {})", path, key, v, n);
    out = static_cast<int32_t>(v);
  };
  id_key("tokenizer.ggml.bos_token_id", t->bos_);
  id_key("tokenizer.ggml.eos_token_id", t->eos_);
  id_key("tokenizer.ggml.padding_token_id", t->pad_);
  t->add_bos_ = f.get_bool_or("tokenizer.ggml.add_bos_token", false);
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  const Impl& m = *impl_;
  // Fragments: raw text ranges (id < 0) and special tokens, in text order.
  struct Frag {
    int32_t id;
    size_t off, len;
  };
  std::vector<Frag> frags{{-1, 0, text.size()}};
  std::vector<Frag> next;
  for (int32_t sid : m.specials) {
    if (!parse_special && m.types[sid] != TokenType::UserDefined) continue;
    const std::string& st = m.tokens[sid];
    bool any = false;
    next.clear();
    for (const Frag& fr : frags) {
      if (fr.id >= 0 || fr.len < st.size()) {
        next.push_back(fr);
        continue;
      }
      const std::string_view s = text.substr(fr.off, fr.len);
      size_t pos = 0;
      for (;;) {
        const size_t hit = s.find(st, pos);
        if (hit == std::string_view::npos) break;
        any = true;
        if (hit > pos) next.push_back({-1, fr.off + pos, hit - pos});
        next.push_back({sid, fr.off + hit, st.size()});
        pos = hit + st.size();
      }
      if (pos < s.size()) next.push_back({-1, fr.off + pos, s.size() - pos});
    }
    if (any) frags.swap(next);
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  std::unordered_map<std::string, std::vector<int32_t>> cache;
  for (const Frag& fr : frags) {
    if (fr.id >= 0) {
      out.push_back(fr.id);
    } else if (fr.len > 0) {
      m.encode_raw(text.substr(fr.off, fr.len), out, cache);
    }
  }
  return out;
}

int32_t Tokenizer::n_vocab() const { return impl_->n_vocab(); }

const std::string& Tokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    fail("{}: token id {} is outside the vocabulary (n = {})", path_, id, n_vocab());
  return impl_->tokens[id];
}

TokenType Tokenizer::type(int32_t id) const {
  if (id < 0 || id >= n_vocab())
    fail("{}: token id {} is outside the vocabulary (n = {})", path_, id, n_vocab());
  return impl_->types[id];
}

std::optional<int32_t> Tokenizer::find(std::string_view text) const {
  const int32_t id = impl_->lookup(text);
  if (id < 0) return std::nullopt;
  return id;
}

std::string Tokenizer::piece(int32_t id, bool render_special) const {
  switch (type(id)) {
    case TokenType::Normal:
    case TokenType::Undefined:
      return impl_->pieces[id];
    case TokenType::UserDefined:
      return impl_->tokens[id];
    case TokenType::Control:
      return render_special ? impl_->tokens[id] : std::string();
    default:  // unknown / unused / byte: llama.cpp renders nothing for a BPE vocabulary
      return {};
  }
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  Detokenizer d(*this, render_special);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  out += d.flush();
  return out;
}

std::string Detokenizer::push(int32_t id) { return push_bytes(tok_->piece(id, render_special_)); }

std::string Detokenizer::push_bytes(std::string_view bytes) {
  std::string out;
  if (pending_.empty()) {
    text::utf8_sanitize(bytes, out, pending_, false);
  } else {
    const std::string buf = pending_ + std::string(bytes);
    text::utf8_sanitize(buf, out, pending_, false);
  }
  return out;
}

std::string Detokenizer::flush() {
  std::string out, rest;
  text::utf8_sanitize(pending_, out, rest, true);
  pending_.clear();
  return out;
}

}  // namespace bonsai
