// bonsai run -m MODEL (-p PROMPT | -f FILE) [...] — one-shot generation.
// The prompt is wrapped in the chat format (system prompt, user turn,
// generation prompt with thinking on or off) unless --raw; generated text
// streams to stdout, everything else (load progress, timing) goes to stderr.
#include <unistd.h>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "commands.h"
#include "text_cli.h"
#include "text_generate.h"

namespace bonsai::cli {
namespace {

struct RunOptions {
  TextOptions t;
  std::string prompt;
  std::string file;
  bool raw = false;
};

void run_run(RunOptions& o, bool have_prompt) {
  o.t.validate();
  if (have_prompt == !o.file.empty()) usage_fail("give exactly one of -p/--prompt and -f/--file");
  require_model_file(o.t.model);
  const std::string text = have_prompt ? o.prompt : read_text_file(o.file, "-f/--file");
  if (text.empty()) usage_fail("the prompt is empty");

  TextModel tm = load_text_model(o.t);
  const Tokenizer& tok = *tm.tok;
  std::vector<int32_t> ids;
  if (o.raw) {
    if (tok.add_bos() && tok.bos() >= 0) ids.push_back(tok.bos());
    const auto t = tok.encode(text, true);
    ids.insert(ids.end(), t.begin(), t.end());
  } else {
    std::vector<ChatMessage> msgs;
    if (!o.t.system_prompt.empty()) msgs.push_back({"system", o.t.system_prompt});
    msgs.push_back({"user", text});
    ids = tok.encode(ChatFormat::render(msgs, true, o.t.thinking()), true);
  }

  Session s(*tm.model, session_options(o.t));
  Sampler sampler(o.t.sampling, s.n_ctx());
  if (static_cast<int64_t>(ids.size()) >= s.n_ctx())
    usage_fail("the prompt is {} tokens but the context (-c) holds {}; raise -c", ids.size(), s.n_ctx());
  fmt::print(stderr, "prompt {} tokens, context {} ({}), seed {}\n", ids.size(), s.n_ctx(),
             kv_cache_summary(s), sampler.seed());

  TokenStreamer out(tok, *tm.chat, !o.raw && o.t.thinking(), o.t.reasoning_hide, ::isatty(STDOUT_FILENO));
  SigintGuard sigint;  // Ctrl-C ends the answer (and still prints the timing)
  GenerationRequest req;
  req.n_predict = o.t.n_predict;
  req.ignore_eos = o.t.ignore_eos;
  req.interrupt = &SigintGuard::flag();
  const GenerationStats st = generate(s, sampler, *tm.chat, ids, req, out);
  fmt::print("\n");
  std::fflush(stdout);
  if (st.end == GenerationStats::End::ContextFull)
    fmt::print(stderr, "context full: all {} positions are used; raise -c for longer answers\n", s.n_ctx());
  if (st.end == GenerationStats::End::Interrupted) fmt::print(stderr, "interrupted\n");
  fmt::print(stderr, "{}\n", timing_line(st));
}

}  // namespace

void add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Generate an answer to one prompt, streamed to stdout");
  add_text_options(cmd, o->t);
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Prompt text");
  cmd->add_option("-f,--file", o->file, "Read the prompt from this file");
  cmd->add_flag("--raw", o->raw, "No chat template: the prompt is fed as is (special tokens parsed)");
  cmd->add_flag("--reasoning-hide", o->t.reasoning_hide, "Do not print the thinking block");
  cmd->callback([o, p] { run_run(*o, p->count() > 0); });
}

}  // namespace bonsai::cli
