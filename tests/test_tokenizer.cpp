// Tokenizer unit tests on a hand-built vocabulary: merge order, the
// pre-tokenizer's boundaries, special-token matching, invalid input, the
// streaming detokenizer and the loader's error messages. Every expected id
// list below is worked out by hand from the vocabulary in make_vocab().
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <random>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"
#include "bonsai/tokenizer.h"

namespace bonsai {
namespace {

// GPT-2's byte -> code point table, written from its definition: printable
// Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in order.
std::string byte_char(int b) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    uint32_t n = 0;
    for (int i = 0; i < 256; ++i) {
      const bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174);
      t[i] = printable ? i : 256 + n++;
    }
    return t;
  }();
  const uint32_t cp = table[b];
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Byte-level string of raw bytes.
std::string bl(std::string_view raw) {
  std::string s;
  for (char c : raw) s += byte_char(static_cast<uint8_t>(c));
  return s;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  int32_t add(std::string t, int32_t type = 1) {
    tokens.push_back(std::move(t));
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
  // Adds merge "a b" (raw bytes) and its result token.
  int32_t merge(std::string_view a, std::string_view b) {
    merges.push_back(bl(a) + " " + bl(b));
    return add(bl(std::string(a) + std::string(b)));
  }
};

// ids 0..255: the single bytes (id == byte value). Then, in merge-rank order:
constexpr int32_t kLL = 256, kHe = 257, kHell = 258, kHello = 259, kBc = 260, kAb = 261, kAa = 262,
                  kApS = 263, kNlNl = 264, kSpB = 265, kNel = 266, kNelNel = 267, k12 = 268;
// specials
constexpr int32_t kImStart = 269, kIm = 270, kThink = 271, kEot = 272;

Vocab make_vocab() {
  Vocab v;
  for (int b = 0; b < 256; ++b) v.add(byte_char(b));
  EXPECT_EQ(v.merge("l", "l"), kLL);
  EXPECT_EQ(v.merge("h", "e"), kHe);
  EXPECT_EQ(v.merge("he", "ll"), kHell);
  EXPECT_EQ(v.merge("hell", "o"), kHello);
  EXPECT_EQ(v.merge("b", "c"), kBc);
  EXPECT_EQ(v.merge("a", "b"), kAb);
  EXPECT_EQ(v.merge("a", "a"), kAa);
  EXPECT_EQ(v.merge("'", "s"), kApS);
  EXPECT_EQ(v.merge("\n", "\n"), kNlNl);
  EXPECT_EQ(v.merge(" ", "b"), kSpB);
  EXPECT_EQ(v.merge("\xC2", "\x85"), kNel);
  EXPECT_EQ(v.merge("\xC2\x85", "\xC2\x85"), kNelNel);
  EXPECT_EQ(v.merge("1", "2"), k12);
  EXPECT_EQ(v.add("<|im_start|>", 3), kImStart);
  EXPECT_EQ(v.add("<|im", 3), kIm);
  EXPECT_EQ(v.add("<think>", 4), kThink);
  EXPECT_EQ(v.add("<|endoftext|>", 1), kEot);  // typed normal: forced to control by its name
  return v;
}

struct Built {
  std::vector<uint8_t> bytes;
  std::optional<GgufFile> gguf;
  const GgufFile& file() const { return *gguf; }
};

std::unique_ptr<Built> build(const Vocab& v, std::string_view model = "gpt2", std::string_view pre = "qwen35",
                             bool with_merges = true) {
  GgufWriter w;
  w.add_string("general.architecture", "qwen35");
  w.add_string("tokenizer.ggml.model", model);
  if (!pre.empty()) w.add_string("tokenizer.ggml.pre", pre);
  w.add_array_strings("tokenizer.ggml.tokens", v.tokens);
  w.add_array_i32("tokenizer.ggml.token_type", v.types);
  if (with_merges) w.add_array_strings("tokenizer.ggml.merges", v.merges);
  w.add_u32("tokenizer.ggml.eos_token_id", kImStart);
  auto bytes = w.write_memory();
  auto b = std::make_unique<Built>();
  b->bytes = std::move(bytes);
  b->gguf.emplace(GgufFile::from_memory(b->bytes.data(), b->bytes.size(), "vocab.gguf"));
  return b;
}

class TinyVocab : public ::testing::Test {
 protected:
  void SetUp() override {
    built_ = build(make_vocab());
    tok_ = Tokenizer::from_gguf(built_->file());
  }
  std::vector<int32_t> enc(std::string_view s, bool ps = false) { return tok_->encode(s, ps); }
  std::unique_ptr<Built> built_;
  std::unique_ptr<Tokenizer> tok_;
};

using V = std::vector<int32_t>;

TEST_F(TinyVocab, MergesApplyByRank) {
  EXPECT_EQ(enc("hello"), V({kHello}));
  // "b c" (rank 4) is applied before "a b" (rank 5).
  EXPECT_EQ(enc("abc"), V({'a', kBc}));
  EXPECT_EQ(enc("ab"), V({kAb}));
  // Equal ranks: leftmost first, and a merged symbol cannot merge again.
  EXPECT_EQ(enc("aaa"), V({kAa, 'a'}));
  EXPECT_EQ(enc("aaaa"), V({kAa, kAa}));
  EXPECT_EQ(enc("hellohe"), V({kHello, kHe}));
  EXPECT_EQ(enc(""), V());
}

TEST_F(TinyVocab, PreTokenizerBoundaries) {
  // " hello" is one pre-token; no merge joins the space to "hello".
  EXPECT_EQ(enc("hello hello"), V({kHello, ' ', kHello}));
  // Digits are split one by one, so the "1 2" merge never applies.
  EXPECT_EQ(enc("123"), V({'1', '2', '3'}));
  EXPECT_EQ(enc("it's"), V({'i', 't', kApS}));
  EXPECT_EQ(enc("a\n\nb"), V({'a', kNlNl, 'b'}));
  // "\s+(?!\S)" leaves the last space to the following word: "a", " ", " b".
  EXPECT_EQ(enc("a  b"), V({'a', ' ', kSpB}));
  // U+0085 counts as whitespace (as in llama.cpp): "a", NEL, NEL+"b" — not
  // one punctuation run NEL NEL.
  EXPECT_EQ(enc("a\xC2\x85\xC2\x85"
                "b"),
            V({'a', kNel, kNel, 'b'}));
}

TEST_F(TinyVocab, InvalidBytesBecomeReplacementChar) {
  // 0xFF is not UTF-8: it is tokenized as U+FFFD (EF BF BD).
  EXPECT_EQ(enc("\xFF"), V({0xEF, 0xBF, 0xBD}));
  // Truncated 3-byte sequence at the end: each byte is replaced.
  EXPECT_EQ(enc("a\xE2\x82"), V({'a', 0xEF, 0xBF, 0xBD, 0xEF, 0xBF, 0xBD}));
}

TEST_F(TinyVocab, SpecialTokens) {
  // Control tokens are text unless parse_special.
  EXPECT_EQ(enc("<|im_start|>", true), V({kImStart}));
  EXPECT_EQ(enc("<|im_start|>", false)[0], '<');
  // Longest match first: "<|im_start|>" wins over its prefix "<|im".
  EXPECT_EQ(enc("x<|im_start|><|im", true), V({'x', kImStart, kIm}));
  // User-defined tokens always match.
  EXPECT_EQ(enc("<think>hello", false), V({kThink, kHello}));
  EXPECT_EQ(enc("<think>hello", true), V({kThink, kHello}));
  // <|endoftext|> was typed normal but is a control token by name.
  EXPECT_EQ(tok_->type(kEot), TokenType::Control);
  EXPECT_EQ(enc("<|endoftext|>", true), V({kEot}));
  EXPECT_NE(enc("<|endoftext|>", false), V({kEot}));
}

TEST_F(TinyVocab, DecodeAndPieces) {
  EXPECT_EQ(tok_->piece(kHello), "hello");
  EXPECT_EQ(tok_->piece(' '), " ");
  EXPECT_EQ(tok_->piece(kImStart), "<|im_start|>");
  EXPECT_EQ(tok_->piece(kImStart, false), "");
  EXPECT_EQ(tok_->piece(kThink, false), "<think>");  // user-defined: always text
  const V ids = {kImStart, kHello, ' ', kHello};
  EXPECT_EQ(tok_->decode(ids), "<|im_start|>hello hello");
  EXPECT_EQ(tok_->decode(ids, false), "hello hello");
  EXPECT_EQ(tok_->decode(V({0xFF, 'a'})),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(*tok_->find("<think>"), kThink);
  EXPECT_FALSE(tok_->find("nope").has_value());
  EXPECT_EQ(tok_->eos(), kImStart);
  EXPECT_EQ(tok_->bos(), -1);
  EXPECT_THROW(tok_->piece(100000), Error);
}

TEST_F(TinyVocab, DetokenizerHoldsSplitCharacters) {
  Detokenizer d(*tok_);
  // "€" = E2 82 AC arrives one byte per token.
  EXPECT_EQ(d.push(0xE2), "");
  EXPECT_TRUE(d.has_pending());
  EXPECT_EQ(d.push(0x82), "");
  EXPECT_EQ(d.push(0xAC), "\xE2\x82\xAC");
  EXPECT_FALSE(d.has_pending());
  // A stray continuation byte is replaced at once.
  EXPECT_EQ(d.push(0x80), "\xEF\xBF\xBD");
  // A lead byte followed by a non-continuation: one U+FFFD, then the char.
  EXPECT_EQ(d.push(0xE2), "");
  EXPECT_EQ(d.push('a'),
            "\xEF\xBF\xBD"
            "a");
  // Surrogates (ED A0..) are invalid UTF-8 in output.
  EXPECT_EQ(d.push(0xED), "");
  EXPECT_EQ(d.push(0xA0), "\xEF\xBF\xBD\xEF\xBF\xBD");
  // An incomplete character at the end of the stream.
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
}

TEST_F(TinyVocab, RoundTripRandomText) {
  // decode(encode(x)) == x for any valid UTF-8 x; the pieces below mix
  // scripts, marks, digits, whitespace kinds and special-token text.
  const std::vector<std::string> parts = {
      "hello",     " ",    "  ", "\n",       "\r\n",     "\t",   "abc",          "123",     "it's", "é",
      "e\xCC\x81", "日本", "😀",  "\xC2\x85", "\xC2\xA0", "<|im", "<|im_start|>", "<think>", "!?",   "'S"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) s += parts[rng() % parts.size()];
    for (bool ps : {false, true}) EXPECT_EQ(tok_->decode(tok_->encode(s, ps)), s) << s;
  }
}

TEST(TokenizerLoad, Errors) {
  const Vocab v = make_vocab();
  auto expect_error = [](const std::function<void()>& f, std::initializer_list<const char*> parts) {
    try {
      f();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const char* p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  auto unknown_pre = build(v, "gpt2", "llama3");
  expect_error([&] { Tokenizer::from_gguf(unknown_pre->file()); },
               {"vocab.gguf", "tokenizer.ggml.pre", "llama3", "qwen35", "qwen2"});
  auto no_pre = build(v, "gpt2", "");
  expect_error([&] { Tokenizer::from_gguf(no_pre->file()); }, {"tokenizer.ggml.pre", "qwen35"});
  auto no_vocab = build(v, "no_vocab");
  EXPECT_FALSE(Tokenizer::has_vocab(no_vocab->file()));
  expect_error([&] { Tokenizer::from_gguf(no_vocab->file()); },
               {"vocab.gguf", "model has no vocabulary; text commands need one"});
  auto spm = build(v, "llama");
  expect_error([&] { Tokenizer::from_gguf(spm->file()); }, {"tokenizer.ggml.model", "llama", "gpt2"});
  auto no_merges = build(v, "gpt2", "qwen35", false);
  expect_error([&] { Tokenizer::from_gguf(no_merges->file()); }, {"tokenizer.ggml.merges"});

  GgufWriter w;
  w.add_string("general.architecture", "qwen35");
  auto bytes = w.write_memory();
  GgufFile bare = GgufFile::from_memory(bytes.data(), bytes.size(), "bare.gguf");
  EXPECT_FALSE(Tokenizer::has_vocab(bare));
  expect_error([&] { Tokenizer::from_gguf(bare); }, {"bare.gguf", "model has no vocabulary"});

  Vocab bad = v;
  bad.types[3] = 9;
  auto bad_type = build(bad);
  expect_error([&] { Tokenizer::from_gguf(bad_type->file()); }, {"tokenizer.ggml.token_type", "entry 3"});
  Vocab bad_merge = v;
  bad_merge.merges.push_back("nospace");
  auto bm = build(bad_merge);
  expect_error([&] { Tokenizer::from_gguf(bm->file()); }, {"tokenizer.ggml.merges", "nospace"});
}

}  // namespace
}  // namespace bonsai
