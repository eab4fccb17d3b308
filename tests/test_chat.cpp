// Chat format: exact ChatML strings, the incremental history (deltas add up
// to the full rendering, also at the token level), stop tokens and the
// template check.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>

#include "bonsai/chat.h"
#include "bonsai/gguf.h"
#include "bonsai/gguf_writer.h"
#include "bonsai/tokenizer.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;
const fs::path kVocab = fs::path(BONSAI_FIXTURES_DIR) / "tokenizer" / "qwen3-vocab.gguf";

TEST(ChatFormat, ExactStrings) {
  EXPECT_EQ(ChatFormat::message({"user", "hi"}), "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(ChatFormat::generation_prompt(true), "<|im_start|>assistant\n<think>\n");
  EXPECT_EQ(ChatFormat::generation_prompt(false), "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(ChatFormat::render({{"system", "S"}, {"user", "U"}}, true, false),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n");
  EXPECT_EQ(ChatFormat::render({{"user", "U"}}, false, true), "<|im_start|>user\nU<|im_end|>\n");
}

TEST(ChatHistory, DeltasAddUpToTheFullRendering) {
  ChatHistory h("Be brief.");
  std::string fed;
  const std::string d1 = h.add_user("Hello", true);
  EXPECT_EQ(d1,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n");
  fed += d1;
  fed += "hmm</think>\n\nHi!";
  h.add_assistant("hmm</think>\n\nHi!");
  EXPECT_EQ(h.render(), fed);
  const std::string d2 = h.add_user("Again", false);
  // The open assistant turn is closed first; no second system prompt.
  EXPECT_EQ(d2,
            "<|im_end|>\n<|im_start|>user\nAgain<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  fed += d2;
  fed += "Hi again.";
  h.add_assistant("Hi again.");
  EXPECT_EQ(h.render(), fed);
  ASSERT_EQ(h.messages().size(), 5u);
  EXPECT_EQ(h.messages()[2].content, "<think>\nhmm</think>\n\nHi!");

  // /regen: the answer is dropped, the generation prompt stays.
  EXPECT_TRUE(h.clear_last_answer());
  EXPECT_EQ(h.render(), fed.substr(0, fed.size() - std::string("Hi again.").size()));

  h.clear();
  EXPECT_TRUE(h.empty());
  EXPECT_FALSE(h.clear_last_answer());
  h.set_system("");
  EXPECT_EQ(h.add_user("x", false),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatFormat, RealVocabulary) {
  if (!fs::exists(kVocab)) GTEST_SKIP() << "tokenizer fixtures not found at " << kVocab;
  GgufFile f = GgufFile::open(kVocab.string());
  auto tok = Tokenizer::from_gguf(f);
  ChatFormat fmt = ChatFormat::from_gguf(f, *tok);
  EXPECT_TRUE(fmt.template_is_chatml());
  // README: <|endoftext|> = 151643, <|im_end|> = 151645 = EOS.
  EXPECT_EQ(fmt.stop_tokens(), std::vector<int32_t>({151643, 151645}));
  EXPECT_TRUE(fmt.is_stop(151645));
  EXPECT_FALSE(fmt.is_stop(151644));
  EXPECT_EQ(fmt.think_open(), *tok->find("<think>"));
  EXPECT_EQ(fmt.think_close(), *tok->find("</think>"));

  // The same prompt as the fixture case recorded with llama-tokenize.
  EXPECT_EQ(ChatFormat::render({{"system", "You are a helpful assistant."}, {"user", "What is 2+2?"}}, false,
                               false) +
                "<|im_start|>assistant\n",
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is "
            "2+2?<|im_end|>\n<|im_start|>assistant\n");

  // Token level: feeding the deltas one after another gives the same ids as
  // tokenizing the whole conversation (each delta begins with a special token
  // and so starts a new pre-token), which is what KV-cache reuse relies on.
  ChatHistory h("You are terse.");
  std::vector<int32_t> fed;
  auto feed = [&](const std::string& s) {
    auto ids = tok->encode(s, true);
    fed.insert(fed.end(), ids.begin(), ids.end());
  };
  feed(h.add_user("  Leading spaces\n\nand 123 numbers", true));
  feed("Let me think.</think>\n\nSure: 42.");
  h.add_assistant("Let me think.</think>\n\nSure: 42.");
  feed(h.add_user("\nAnd again?", false));
  feed("Done ");
  h.add_assistant("Done ");
  feed(h.add_user("Bye", false));
  EXPECT_EQ(fed, tok->encode(h.render(), true));
}

TEST(ChatFormat, NonChatMLTemplateFallsBack) {
  if (!fs::exists(kVocab)) GTEST_SKIP() << "tokenizer fixtures not found at " << kVocab;
  GgufFile vocab = GgufFile::open(kVocab.string());
  auto tok = Tokenizer::from_gguf(vocab);
  GgufWriter w;
  w.add_string("tokenizer.chat_template", "{{ bos_token }}[INST] {{ message }} [/INST]");
  auto bytes = w.write_memory();
  GgufFile f = GgufFile::from_memory(bytes.data(), bytes.size(), "mistral.gguf");
  ChatFormat fmt = ChatFormat::from_gguf(f, *tok);
  EXPECT_FALSE(fmt.template_is_chatml());
  EXPECT_EQ(fmt.stop_tokens().size(), 2u);  // still ChatML stops
}

}  // namespace
}  // namespace bonsai
