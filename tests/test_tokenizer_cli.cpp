// `bonsai tokenize` end to end: --ids prints exactly one JSON line with the
// fixture's ids, the default listing pairs ids with pieces, errors exit 2
// (usage) or 1 (bad file).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "text_cli_run.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;
using testing::run_bonsai;
using testing::shq;

const fs::path kDir = fs::path(BONSAI_FIXTURES_DIR) / "tokenizer";

TEST(TokenizeCli, IdsMatchTheFixture) {
  if (!fs::exists(kDir / "manifest.json")) GTEST_SKIP() << "tokenizer fixtures not found in " << kDir;
  std::ifstream in(kDir / "manifest.json");
  const auto j = nlohmann::json::parse(in);
  const std::string vocab = (kDir / "qwen3-vocab.gguf").string();
  int checked = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text");
    // A handful of cases through the CLI (the library test covers all of them);
    // text goes through a file so any bytes (NUL included) arrive verbatim.
    if (checked >= 4 && text.find('\0') == std::string::npos) continue;
    testing::TempPath f("prompt");
    testing::write_file(f.path, text);
    const bool ps = c.at("parse_special");
    const auto r = run_bonsai("tokenize -m " + shq(vocab) + " -f " + shq(f.path) + " --ids" +
                              (ps ? " --parse-special" : ""));
    ASSERT_EQ(r.rc, 0) << r.err;
    ASSERT_FALSE(r.out.empty());
    EXPECT_EQ(r.out.back(), '\n');
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line only: " << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out), c.at("ids")) << text;
    ++checked;
  }
  EXPECT_GE(checked, 4);
}

TEST(TokenizeCli, ListsIdsWithPieces) {
  if (!fs::exists(kDir / "manifest.json")) GTEST_SKIP() << "tokenizer fixtures not found in " << kDir;
  const std::string vocab = (kDir / "qwen3-vocab.gguf").string();
  // "Hello world" = 9707, 1879 (fixture); <|im_end|> = 151645 (README).
  auto r =
      run_bonsai("tokenize -m " + shq(vocab) + " -p " + shq("Hello world<|im_end|>\n") + " --parse-special");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "  9707 -> 'Hello'\n  1879 -> ' world'\n151645 -> '<|im_end|>'\n   198 -> '\\n'\n");
  // Without --parse-special the control token is plain text.
  r = run_bonsai("tokenize -m " + shq(vocab) + " -p " + shq("<|im_end|>") + " --ids");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out, "[151645]\n");
  r = run_bonsai("tokenize -m " + shq(vocab) + " -p '' --ids");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "[]\n");
}

TEST(TokenizeCli, Errors) {
  // An existing file that is not GGUF: the argument checks below must refuse before the model is read,
  // so they need no fixture (a missing -m would refuse them for the wrong reason).
  testing::TempPath junk("junk");
  testing::write_file(junk.path, "not a gguf file at all");
  auto r = run_bonsai("tokenize -m /nonexistent/model.gguf -p hi");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  r = run_bonsai("tokenize -p hi");  // no model
  EXPECT_EQ(r.rc, 2) << r.err;
  r = run_bonsai("tokenize -m " + shq(junk.path));  // no text
  EXPECT_EQ(r.rc, 2) << r.err;
  r = run_bonsai("tokenize -m " + shq(junk.path) + " -f /nonexistent/prompt.txt");
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_NE(r.err.find("-f"), std::string::npos) << r.err;
  // A file that is not GGUF: a bad file, exit 1.
  r = run_bonsai("tokenize -m " + shq(junk.path) + " -p hi");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_TRUE(r.out.empty());
  // A logits-only model (no_vocab): a clear message, exit 1.
  testing::TempPath no_vocab("no-vocab.gguf");
  r = run_bonsai("synth --preset tiny --no-vocab -q -o " + shq(no_vocab.path));
  ASSERT_EQ(r.rc, 0) << r.err;
  r = run_bonsai("tokenize -m " + shq(no_vocab.path) + " -p hi");
  EXPECT_EQ(r.rc, 1) << r.err;
  EXPECT_NE(r.err.find("model has no vocabulary; text commands need one"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace bonsai
