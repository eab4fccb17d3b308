// bonsai chat -m MODEL [...] — a multi-turn conversation.
//
// One Session holds the whole conversation: each user turn feeds only its
// own tokens (ChatHistory::add_user's delta) on top of the KV cache and
// recurrent state left by the previous turns, never the history again. After
// each turn's prompt is fed, a snapshot is kept so /regen can go back to it
// and sample a new answer.
//
// At a terminal lines are read with libedit (editing, history); from a pipe
// plain lines are read, one user turn per line, and only the answers go to
// stdout (one per turn, each ending with a newline). The per-turn timing line
// on stderr also reports the context position and Session::tokens_processed()
// (equal when nothing was recomputed).
#include <editline/readline.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>

#include <fmt/core.h>

#include "bonsai/error.h"
#include "commands.h"
#include "text_cli.h"
#include "text_generate.h"

namespace bonsai::cli {
namespace {

constexpr const char* kHelp =
    "commands: /exit (or Ctrl-D) quit | /clear new conversation | /regen new answer to the last message | "
    "/system TEXT set the system prompt and start over | Ctrl-C stops an answer";

class LineReader {
 public:
  explicit LineReader(bool interactive) : interactive_(interactive) {}
  std::optional<std::string> read() {
    if (interactive_) {
      char* p = ::readline("> ");
      if (!p) return std::nullopt;
      std::string line(p);
      std::free(p);
      if (!line.empty()) ::add_history(line.c_str());
      return line;
    }
    std::string line;
    if (!std::getline(std::cin, line)) return std::nullopt;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return line;
  }

 private:
  bool interactive_;
};

class ChatRepl {
 public:
  explicit ChatRepl(TextOptions& o)
      : o_(o),
        tm_(load_text_model(o)),
        session_(*tm_.model, session_options(o)),
        sampler_(o.sampling, session_.n_ctx()),
        history_(o.system_prompt),
        interactive_(::isatty(STDIN_FILENO)),
        color_(::isatty(STDOUT_FILENO)) {}

  void run() {
    fmt::print(stderr, "chat: context {} ({}), seed {}, reasoning {}{}\n{}\n", session_.n_ctx(),
               kv_cache_summary(session_), sampler_.seed(), o_.reasoning,
               o_.reasoning_hide ? " (hidden)" : "", kHelp);
    LineReader reader(interactive_);
    while (auto line = reader.read()) {
      if (line->empty()) continue;
      if ((*line)[0] == '/') {
        if (!command(*line)) break;
        continue;
      }
      user_turn(*line);
    }
    if (interactive_) fmt::print("\n");
  }

 private:
  // Returns false for /exit.
  bool command(const std::string& line) {
    const size_t sp = line.find(' ');
    const std::string cmd = line.substr(0, sp);
    const std::string arg = sp == std::string::npos ? "" : line.substr(sp + 1);
    if (cmd == "/exit" || cmd == "/quit") return false;
    if (cmd == "/clear") {
      restart();
      fmt::print(stderr, "(conversation cleared)\n");
    } else if (cmd == "/system") {
      history_.set_system(arg);
      restart();
      fmt::print(stderr, "(system prompt {}; conversation cleared)\n", arg.empty() ? "removed" : "set");
    } else if (cmd == "/regen") {
      regen();
    } else {
      fmt::print(stderr, "{}\n", kHelp);
    }
    return true;
  }

  void restart() {
    session_.reset();
    history_.clear();
    sampler_.reset_history();
    snapshot_.reset();
  }

  void user_turn(const std::string& text) {
    const ChatHistory before = history_;
    const std::string delta = history_.add_user(text, o_.thinking());
    const std::vector<int32_t> ids = tm_.tok->encode(delta, true);
    // The answer needs at least one free position after the prompt.
    if (session_.position() + static_cast<int64_t>(ids.size()) >= session_.n_ctx()) {
      history_ = before;
      fmt::print(stderr,
                 "context full: {} of {} positions used and this turn needs {} more; /clear to start over\n",
                 session_.position(), session_.n_ctx(), ids.size());
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    session_.prefill(ids);
    for (int32_t t : ids) sampler_.accept(t);
    const double prompt_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    snapshot_ = session_.snapshot();
    snapshot_sampler_ = sampler_.history();
    answer(static_cast<int>(ids.size()), prompt_s);
  }

  void regen() {
    if (!snapshot_) {
      fmt::print(stderr, "(nothing to regenerate)\n");
      return;
    }
    session_.restore(*snapshot_);
    sampler_.set_history(snapshot_sampler_);
    history_.clear_last_answer();
    answer(0, 0.0);
  }

  // Samples the answer from the current logits.
  void answer(int prompt_tokens, double prompt_s) {
    TokenStreamer out(*tm_.tok, *tm_.chat, o_.thinking(), o_.reasoning_hide, color_);
    SigintGuard sigint;
    GenerationRequest req;
    req.n_predict = o_.n_predict;
    req.ignore_eos = o_.ignore_eos;
    req.decode_last = true;
    req.interrupt = &SigintGuard::flag();
    GenerationStats st = generate(session_, sampler_, *tm_.chat, {}, req, out);
    st.prompt_tokens = prompt_tokens;
    st.prompt_s = prompt_s;
    history_.add_assistant(out.text());
    fmt::print("\n");
    std::fflush(stdout);
    if (st.end == GenerationStats::End::Interrupted) fmt::print(stderr, "(stopped)\n");
    if (st.end == GenerationStats::End::ContextFull)
      fmt::print(stderr, "context full: all {} positions are used; /clear to start a new conversation\n",
                 session_.n_ctx());
    fmt::print(stderr, "{} | context {}/{} | processed {}\n", timing_line(st), session_.position(),
               session_.n_ctx(), session_.tokens_processed());
  }

  TextOptions& o_;
  TextModel tm_;
  Session session_;
  Sampler sampler_;
  ChatHistory history_;
  bool interactive_, color_;
  std::unique_ptr<SessionSnapshot> snapshot_;  // state after the last user turn's prompt
  std::deque<int32_t> snapshot_sampler_;       // the sampler's penalty window at that point
};

void run_chat(TextOptions& o) {
  o.validate();
  require_model_file(o.model);
  ChatRepl repl(o);
  repl.run();
}

}  // namespace

void add_chat(CLI::App& app) {
  auto o = std::make_shared<TextOptions>();
  auto* cmd = app.add_subcommand("chat", "Interactive multi-turn chat (reads lines from stdin when piped)");
  add_text_options(cmd, *o);
  cmd->add_flag("--reasoning-hide", o->reasoning_hide, "Do not print the thinking block");
  cmd->callback([o] { run_chat(*o); });
}

}  // namespace bonsai::cli
