// Tokenizer parity with llama.cpp on a real Qwen-family vocabulary:
// ../shared/fixtures/tokenizer/manifest.json (format bonsai-tokenizer/1). Every
// case must give identical ids, and decoding the ids must give the text back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bonsai/gguf.h"
#include "bonsai/tokenizer.h"
#include "text_corpus.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;

const fs::path kManifest = fs::path(BONSAI_FIXTURES_DIR) / "tokenizer" / "manifest.json";

std::string escape(const std::string& s) { return nlohmann::json(s).dump(); }

TEST(TokenizerFixture, AllCasesMatchLlamaCpp) {
  if (!fs::exists(kManifest)) GTEST_SKIP() << "tokenizer fixtures not found at " << kManifest;
  std::ifstream in(kManifest);
  const nlohmann::json j = nlohmann::json::parse(in);
  ASSERT_EQ(j.at("format"), "bonsai-tokenizer/1");
  GgufFile f = GgufFile::open((kManifest.parent_path() / j.at("vocab").get<std::string>()).string());
  auto tok = Tokenizer::from_gguf(f);
  size_t n = 0, pass = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text");
    const bool ps = c.at("parse_special");
    const std::vector<int32_t> want = c.at("ids");
    const std::vector<int32_t> got = tok->encode(text, ps);
    ++n;
    EXPECT_EQ(got, want) << "text " << escape(text) << " parse_special=" << ps;
    const std::string detok = tok->decode(want);
    EXPECT_EQ(detok, c.value("detok", text)) << "decode of " << escape(text);
    EXPECT_EQ(detok, text);
    if (got == want && detok == text) ++pass;
  }
  EXPECT_EQ(pass, n) << pass << " of " << n << " cases pass";
  EXPECT_GT(n, 0u);
}

// 1 MB of mixed text through the real vocabulary (correctness only; speed is
// measured by bench/bench_tokenizer.cpp): the whole text's ids equal the
// concatenation of its paragraphs' ids (each encode() call has its own word
// cache, so this also checks the cache never changes a result), every id is
// in range, and decoding gives the text back.
TEST(TokenizerFixture, OneMegabyteMixedText) {
  if (!fs::exists(kManifest)) GTEST_SKIP() << "tokenizer fixtures not found at " << kManifest;
  GgufFile f = GgufFile::open((kManifest.parent_path() / "qwen3-vocab.gguf").string());
  auto tok = Tokenizer::from_gguf(f);
  const auto paras = testing::mixed_paragraphs(1 << 20);
  std::string all;
  std::vector<int32_t> concat;
  for (const auto& p : paras) {
    all += p;
    const auto ids = tok->encode(p, false);
    concat.insert(concat.end(), ids.begin(), ids.end());
  }
  const auto ids = tok->encode(all, false);
  ASSERT_EQ(ids, concat);
  for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab());
  EXPECT_LT(ids.size(), all.size());  // merges happened
  EXPECT_EQ(tok->decode(ids), all);
}

}  // namespace
}  // namespace bonsai
