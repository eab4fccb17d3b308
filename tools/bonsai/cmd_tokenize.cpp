// bonsai tokenize -m FILE (-p TEXT | -f FILE) [--parse-special] [--ids]
// In the manner of llama-tokenize: each id with its piece, or with --ids one
// JSON array of ids on one line and nothing else on stdout. Only the GGUF's
// tokenizer.* keys are read, so a vocab-only file works. Nothing is added to
// the text (no BOS/EOS).
#include <fmt/core.h>

#include "bonsai/error.h"
#include "bonsai/gguf.h"
#include "bonsai/tokenizer.h"
#include "commands.h"
#include "text_cli.h"

namespace bonsai::cli {
namespace {

struct TokenizeOptions {
  std::string model;
  std::string prompt;
  std::string file;
  bool parse_special = false;
  bool ids_only = false;
};

void run_tokenize(const TokenizeOptions& o, bool have_prompt) {
  require_model_file(o.model);
  if (have_prompt == !o.file.empty()) usage_fail("give exactly one of -p/--prompt and -f/--file");
  const std::string text = have_prompt ? o.prompt : read_text_file(o.file, "-f/--file");
  GgufFile f = GgufFile::open(o.model);
  auto tok = Tokenizer::from_gguf(f);
  const std::vector<int32_t> ids = tok->encode(text, o.parse_special);
  if (o.ids_only) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += fmt::format("{}{}", i ? ", " : "", ids[i]);
    line += "]\n";
    fmt::print("{}", line);
    return;
  }
  for (int32_t id : ids) fmt::print("{:>6} -> '{}'\n", id, escape_piece(tok->piece(id)));
}

}  // namespace

void add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd =
      app.add_subcommand("tokenize", "Tokenize text with a GGUF file's vocabulary (like llama-tokenize)");
  cmd->add_option("-m,--model", o->model, "GGUF file with a tokenizer (a vocab-only file is enough)")
      ->required();
  auto* p = cmd->add_option("-p,--prompt", o->prompt, "Text to tokenize");
  cmd->add_option("-f,--file", o->file, "Read the text from this file (bytes used verbatim)");
  cmd->add_flag("--parse-special", o->parse_special,
                "Match control tokens such as <|im_start|> in the text (user-defined tokens such as <think> "
                "always match)");
  cmd->add_flag("--ids", o->ids_only, "Print only one JSON array of the ids on one line");
  cmd->callback([o, p] { run_tokenize(*o, p->count() > 0); });
}

}  // namespace bonsai::cli
