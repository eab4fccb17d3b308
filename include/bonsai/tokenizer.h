// Byte-level BPE tokenizer read from GGUF metadata (tokenizer.ggml.model = gpt2),
// with llama.cpp's semantics so that ids match llama-tokenize exactly:
//
//   text --(special-token partition)--> fragments: raw text | token id
//   raw text --(lenient UTF-8 decode, invalid byte -> U+FFFD)--> --(pre-tokenizer
//   regex, PCRE2)--> pre-tokens --(GPT-2 byte->char map, BPE by merge rank)--> ids
//
// Special tokens (control, user-defined, unknown) are cut out of the text
// longest first. Control/unknown tokens only when parse_special is set;
// user-defined tokens (`<think>`, `<tool_call>`, ...) always, as llama.cpp and
// HF tokenizers do. Decoding turns normal tokens back into bytes; special
// tokens are rendered as their text. Detokenizer is the streaming form.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai {

class GgufFile;

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : uint8_t {
  Undefined = 0,
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

class Tokenizer {
 public:
  // Pre-tokenizers understood (tokenizer.ggml.pre).
  static constexpr std::string_view kSupportedPre[] = {"qwen35", "qwen2"};

  // True when `f` carries a usable vocabulary (tokenizer.ggml.model present,
  // not `no_vocab`).
  static bool has_vocab(const GgufFile& f);
  // Reads and validates the tokenizer.* keys. Throws bonsai::Error naming the
  // file and key; a file without a vocabulary gets "model has no vocabulary;
  // text commands need one".
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;
  ~Tokenizer();

  // Text -> ids. Nothing is added (no BOS/EOS). Thread-safe (const, no shared cache).
  std::vector<int32_t> encode(std::string_view text, bool parse_special) const;

  // Bytes of one token: a normal token's byte-level string decoded to bytes
  // (may be part of a UTF-8 character), a special token's text. Control
  // tokens give "" when render_special is false.
  std::string piece(int32_t id, bool render_special = true) const;
  // ids -> UTF-8 text; invalid/incomplete byte sequences become U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool render_special = true) const;

  int32_t n_vocab() const;
  const std::string& token_text(int32_t id) const;  // the vocabulary string, as stored
  TokenType type(int32_t id) const;
  bool is_control(int32_t id) const { return type(id) == TokenType::Control; }
  // Exact vocabulary lookup of a token string (e.g. "<|im_end|>").
  std::optional<int32_t> find(std::string_view text) const;

  int32_t bos() const { return bos_; }  // -1 when absent
  int32_t eos() const { return eos_; }
  int32_t pad() const { return pad_; }
  bool add_bos() const { return add_bos_; }
  const std::string& pre() const { return pre_; }
  const std::string& path() const { return path_; }

 private:
  struct Impl;
  Tokenizer();
  std::unique_ptr<Impl> impl_;
  int32_t bos_ = -1, eos_ = -1, pad_ = -1;
  bool add_bos_ = false;
  std::string pre_, path_;
};

// Streaming ids -> text. push() returns the text that is complete so far: a
// UTF-8 character whose bytes are split across tokens is held back until its
// last byte arrives; bytes that cannot start or continue a character become
// U+FFFD as soon as that is known. flush() ends the stream (an incomplete
// trailing character becomes U+FFFD).
class Detokenizer {
 public:
  explicit Detokenizer(const Tokenizer& tok, bool render_special = true)
      : tok_(&tok), render_special_(render_special) {}
  std::string push(int32_t id);
  std::string push_bytes(std::string_view bytes);
  std::string flush();
  void reset() { pending_.clear(); }
  bool has_pending() const { return !pending_.empty(); }

 private:
  const Tokenizer* tok_;
  bool render_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 character (at most 3)
};

}  // namespace bonsai
