// Tokenizer parity with llama.cpp on a real Qwen-family vocabulary:
// ../shared/fixtures/tokenizer/manifest.json (format bonsai-tokenizer/1). Every
// case must give identical ids, and decoding the ids must give the text back.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bonsai/gguf.h"
#include "bonsai/tokenizer.h"

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

}  // namespace
}  // namespace bonsai
