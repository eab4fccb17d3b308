// `bonsai run` and `bonsai chat` end to end on a synthesized tiny model with a
// vocabulary (`bonsai synth --preset tiny`): streaming + timing line, seeds,
// a 3-turn piped chat that never recomputes earlier turns, /regen, a full
// context, and the usage / bad-file errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "bonsai/chat.h"
#include "bonsai/gguf.h"
#include "bonsai/tokenizer.h"
#include "text_cli_run.h"

namespace bonsai {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::run_bonsai;
using testing::shq;

struct TurnStats {
  int prompt = 0, generated = 0, context = 0, processed = 0;
};

// Parses the timing lines: run's
// "timing: prompt P tokens, X tok/s | generated G tokens, Y tok/s" and chat's,
// which add " | context C/N | processed T". (sscanf, not std::regex: GCC 12
// warns inside <regex> under -fsanitize at -O2.)
std::vector<TurnStats> turns(const std::string& err, bool chat = true) {
  std::vector<TurnStats> v;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    TurnStats t;
    double r1 = 0, r2 = 0;
    int n_ctx = 0;
    const int got =
        std::sscanf(line.c_str(),
                    "timing: prompt %d tokens, %lf tok/s | generated %d tokens, %lf tok/s | context "
                    "%d/%d | processed %d",
                    &t.prompt, &r1, &t.generated, &r2, &t.context, &n_ctx, &t.processed);
    if (got == (chat ? 7 : 4)) v.push_back(t);
  }
  return v;
}

// The "prompt N tokens, context ..." line of run.
int prompt_tokens(const std::string& err) {
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    int n = 0, c = 0;
    if (std::sscanf(line.c_str(), "prompt %d tokens, context %d", &n, &c) == 2) return n;
  }
  return -1;
}

class TextCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = new testing::TempPath("tiny.gguf");
    const CliResult r = run_bonsai("synth --preset tiny -q -o " + shq(model_->path));
    ASSERT_EQ(r.rc, 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  static std::string m() { return " -m " + shq(model_->path) + " "; }
  static testing::TempPath* model_;
};
testing::TempPath* TextCli::model_ = nullptr;

TEST_F(TextCli, RunStreamsNTokensAndTimes) {
  const CliResult r = run_bonsai("run" + m() + "-p 'Tell me a story' -n 8 --ignore-eos -s 7");
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.back(), '\n');
  const auto t = turns(r.err, false);
  ASSERT_EQ(t.size(), 1u) << r.err;
  EXPECT_EQ(t[0].generated, 8);
  EXPECT_EQ(t[0].prompt, prompt_tokens(r.err));
  EXPECT_NE(r.err.find("loaded "), std::string::npos) << r.err;  // load indication
}

// An f16 KV cache (-ctk f16 -ctv f16) runs run and chat end to end; greedy decoding on the tiny model
// comes out the same as with the f32 cache (its margins are far above what rounding the cache moves).
// The default (auto) on the CPU path is f32; one side given, the other follows it.
TEST_F(TextCli, F16CacheRunsRunAndChat) {
  const std::string args = "run" + m() + "--path fast -p 'Tell me a story' -n 12 --ignore-eos --temp 0 ";
  const CliResult a = run_bonsai(args);
  const CliResult b = run_bonsai(args + "-ctk f16 -ctv f16");
  ASSERT_EQ(a.rc, 0) << a.err;
  ASSERT_EQ(b.rc, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.err.find("(KV cache f32, "), std::string::npos) << a.err;
  EXPECT_NE(b.err.find("(KV cache f16, "), std::string::npos) << b.err;
  const CliResult k_only = run_bonsai(args + "-ctk f16");
  ASSERT_EQ(k_only.rc, 0) << k_only.err;
  EXPECT_EQ(k_only.out, b.out);
  EXPECT_NE(k_only.err.find("(KV cache f16, "), std::string::npos) << k_only.err;
  const CliResult c =
      run_bonsai("chat" + m() + "--path fast -n 4 --ignore-eos -s 2 --cache-type-k f16 --cache-type-v f16",
                 "Hi\nAgain\n");
  ASSERT_EQ(c.rc, 0) << c.err;
  EXPECT_EQ(turns(c.err).size(), 2u) << c.err;
  EXPECT_NE(c.err.find("chat: context 4096 (KV cache f16, "), std::string::npos) << c.err;
}

TEST_F(TextCli, SameSeedSameOutput) {
  const std::string args =
      "run" + m() + "-p 'Hello there' -n 16 --ignore-eos --temp 1.0 --top-k 0 --min-p 0 ";
  const CliResult a = run_bonsai(args + "-s 42");
  const CliResult b = run_bonsai(args + "-s 42");
  const CliResult c = run_bonsai(args + "-s 43");
  ASSERT_EQ(a.rc, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  // 16 draws at temperature 1 over a 1024-token vocabulary: another seed
  // giving the same text would take a near-deterministic model, which the
  // synthetic one is not.
  EXPECT_NE(a.out, c.out);
  const std::string chat_in = "Hi\nWhat now?\n";
  const CliResult ca = run_bonsai("chat" + m() + "-n 5 -s 9", chat_in);
  const CliResult cb = run_bonsai("chat" + m() + "-n 5 -s 9", chat_in);
  ASSERT_EQ(ca.rc, 0) << ca.err;
  EXPECT_EQ(ca.out, cb.out);
}

TEST_F(TextCli, ChatReusesTheCacheAcrossThreeTurns) {
  const std::vector<std::string> user = {"Hello, who are you?", "Tell me more about that.", "Thanks, bye."};
  const CliResult r =
      run_bonsai("chat" + m() + "-n 6 --ignore-eos -s 3 -sys 'You are terse.' --reasoning off",
                 user[0] + "\n" + user[1] + "\n" + user[2] + "\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto t = turns(r.err);
  ASSERT_EQ(t.size(), 3u) << r.err;

  // Expected prompt sizes per turn, from the same vocabulary and chat format.
  GgufFile f = GgufFile::open(model_->path);
  auto tok = Tokenizer::from_gguf(f);
  ChatHistory h("You are terse.");
  int context = 0;
  for (size_t i = 0; i < 3; ++i) {
    const int delta = static_cast<int>(tok->encode(h.add_user(user[i], false), true).size());
    h.add_assistant("x");  // content does not matter: only the next delta's size is used
    EXPECT_EQ(t[i].prompt, delta) << "turn " << i;
    EXPECT_EQ(t[i].generated, 6) << "turn " << i;
    context += delta + 6;
    EXPECT_EQ(t[i].context, context) << "turn " << i;
    // Every token was fed exactly once: nothing of an earlier turn was recomputed.
    EXPECT_EQ(t[i].processed, t[i].context) << "turn " << i;
  }
  // Turn 2 fed fewer tokens than the conversation so far holds.
  EXPECT_LT(t[1].prompt, t[0].context);
}

TEST_F(TextCli, ChatRegenAndClear) {
  const CliResult r =
      run_bonsai("chat" + m() + "-n 4 --ignore-eos -s 11", "Hi\n/regen\n/clear\nHi\n/exit\nnever\n");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto t = turns(r.err);
  ASSERT_EQ(t.size(), 3u) << r.err;
  // /regen: back to the state after the prompt, a new answer of 4 tokens.
  EXPECT_EQ(t[1].prompt, 0);
  EXPECT_EQ(t[1].context, t[0].context);
  EXPECT_EQ(t[1].processed, t[0].processed + 4);
  // /clear: the same first turn from an empty context.
  EXPECT_EQ(t[2].prompt, t[0].prompt);
  EXPECT_EQ(t[2].context, t[0].context);
  EXPECT_NE(r.err.find("conversation cleared"), std::string::npos);
}

TEST_F(TextCli, ContextFullIsAMessageNotACrash) {
  // 30 positions: the first turn (about 20 prompt tokens) fills it.
  CliResult r = run_bonsai("chat" + m() + "-c 30 -n 20 --ignore-eos -s 1", "Hello there\nAnd again\n");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("context full"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/clear"), std::string::npos) << r.err;
  r = run_bonsai("run" + m() + "-c 30 -n 50 --ignore-eos -p 'Hello there'");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.err.find("context full"), std::string::npos) << r.err;
  // A prompt longer than the context: usage error.
  r = run_bonsai("run" + m() + "-c 8 -p 'Hello there, this prompt is too long'");
  EXPECT_EQ(r.rc, 2) << r.err;
}

TEST_F(TextCli, UsageErrorsExit2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"run -m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf"},
      {"run" + m() + "-p ''", "empty"},
      {"run" + m(), "-p"},
      {"run" + m() + "-n -2 -p hi", "-n"},
      {"run" + m() + "-c -1 -p hi", "-c"},
      {"run" + m() + "-t -1 -p hi", "-t"},
      {"run" + m() + "-ub -1 -p hi", "-ub/--ubatch-size"},
      {"run" + m() + "--ubatch-size 5000 -p hi", "[1, 4096]"},
      {"run" + m() + "-s -5 -p hi", "--seed"},
      {"run" + m() + "--top-p 1.5 -p hi", "--top-p"},
      {"run" + m() + "--min-p -1 -p hi", "--min-p"},
      {"run" + m() + "--top-k -3 -p hi", "--top-k"},
      {"run" + m() + "--repeat-penalty 0 -p hi", "--repeat-penalty"},
      {"run" + m() + "--repeat-last-n -9 -p hi", "--repeat-last-n"},
      {"run" + m() + "--presence-penalty 9 -p hi", "--presence-penalty"},
      {"run" + m() + "--frequency-penalty -9 -p hi", "--frequency-penalty"},
      {"run" + m() + "--reasoning maybe -p hi", "--reasoning"},
      {"run" + m() + "-p hi -f /nonexistent/prompt.txt", "-p"},
      {"run" + m() + "-f /nonexistent/prompt.txt", "/nonexistent/prompt.txt"},
      {"chat -m /nonexistent/model.gguf", "/nonexistent/model.gguf"},
      {"chat" + m() + "--temp nan", "--temp"},
      {"run" + m() + "-ctk q4_0 -p hi", "valid: auto, f32, f16"},
      {"run" + m() + "-ctk f16 -ctv f32 -p hi", "must have the same type"},
      {"chat" + m() + "-ctk f32 -ctv f16", "-ctv/--cache-type-v is f16"},
      {"run" + m() + "-mg -1 -p hi", "-mg/--main-gpu must be >= 0"},
      {"chat" + m() + "--main-gpu -2", "-mg/--main-gpu must be >= 0"},
      {"gate /nonexistent/manifest.json -mg -1", "-mg/--main-gpu must be >= 0"},
      {"bench" + m() + "-mg -1 -p 0 -n 1 -r 1", "-mg/--main-gpu must be >= 0"},
  };
  for (const auto& [args, needle] : cases) {
    const CliResult r = run_bonsai(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

TEST_F(TextCli, UnknownPathIsRefusedBeforeTheModelLoads) {
  // A typo in --path must not cost a multi-GB load first: every command checks the name up front.
  const std::vector<std::string> cmds = {"run" + m() + "--path gpu -p hi", "chat" + m() + "--backend gpu",
                                         "bench" + m() + "--path fast,gpu -p 0 -n 1 -r 1",
                                         "gate /nonexistent/manifest.json --path gpu"};
  for (const auto& args : cmds) {
    const CliResult r = run_bonsai(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("unknown compute path 'gpu' (available: auto, ref, fast"), std::string::npos)
        << args << "\n"
        << r.err;
    EXPECT_EQ(r.err.find("load"), std::string::npos) << args << "\n" << r.err;  // nothing loaded or read
    EXPECT_TRUE(r.out.empty()) << args;
  }
}

TEST_F(TextCli, BadCpuPrefetchKnobIsRefused) {
  // BONSAI_CPU_STREAM_PF4 / _PF8 (kernels/cpu/matvec.h): one line naming the variable, the value and
  // the range, exit 2, nothing on stdout; read when the CPU backend is made (the child inherits it).
  for (const char* name : {"BONSAI_CPU_STREAM_PF4", "BONSAI_CPU_STREAM_PF8"})
    for (const char* value : {"-5", "65537", "8k"}) {
      ASSERT_EQ(::setenv(name, value, 1), 0);
      const CliResult r = run_bonsai("bench" + m() + "--path fast -p 0 -n 1 -r 1 --no-bandwidth");
      ::unsetenv(name);
      const std::string want = std::string(name) + "='" + value + "': expected an integer in 0 .. 65536";
      EXPECT_EQ(r.rc, 2) << name << "=" << value << "\n" << r.err;
      EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
      EXPECT_EQ(r.out.find("tg1"), std::string::npos) << r.out;
    }
}

TEST_F(TextCli, NoVocabModelIsRefused) {
  testing::TempPath nv("novocab.gguf");
  ASSERT_EQ(run_bonsai("synth --preset tiny --no-vocab -q -o " + shq(nv.path)).rc, 0);
  for (const std::string cmd : {"run -p hi", "chat"}) {
    const CliResult r = run_bonsai(cmd + " -m " + shq(nv.path), "hi\n");
    EXPECT_EQ(r.rc, 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find("model has no vocabulary; text commands need one"), std::string::npos) << r.err;
  }
}

TEST_F(TextCli, SystemPromptRawAndReasoning) {
  const CliResult plain = run_bonsai("run" + m() + "-p hello -n 1");
  const CliResult sys = run_bonsai("run" + m() + "-p hello -n 1 -sys 'Be brief.'");
  const CliResult off = run_bonsai("run" + m() + "-p hello -n 1 --reasoning off");
  const CliResult raw = run_bonsai("run" + m() + "-p hello -n 1 --raw");
  for (const auto* r : {&plain, &sys, &off, &raw}) ASSERT_EQ(r->rc, 0) << r->err;
  GgufFile f = GgufFile::open(model_->path);
  auto tok = Tokenizer::from_gguf(f);
  auto count = [&](const std::string& s) { return static_cast<int>(tok->encode(s, true).size()); };
  EXPECT_EQ(prompt_tokens(plain.err),
            count("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  EXPECT_EQ(prompt_tokens(sys.err),
            count("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhello<|im_end|>"
                  "\n<|im_start|>assistant\n<think>\n"));
  EXPECT_EQ(prompt_tokens(off.err),
            count("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_EQ(prompt_tokens(raw.err), count("hello"));
}

}  // namespace
}  // namespace bonsai
