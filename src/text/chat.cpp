#include "bonsai/chat.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "bonsai/gguf.h"
#include "bonsai/tokenizer.h"

namespace bonsai {

ChatFormat::ChatFormat(const Tokenizer& tok) {
  for (std::string_view s : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = tok.find(s)) stop_.push_back(*id);
  if (tok.eos() >= 0) stop_.push_back(tok.eos());
  std::sort(stop_.begin(), stop_.end());
  stop_.erase(std::unique(stop_.begin(), stop_.end()), stop_.end());
  if (auto id = tok.find("<think>")) think_open_ = *id;
  if (auto id = tok.find("</think>")) think_close_ = *id;
  if (!tok.find("<|im_start|>") || !tok.find("<|im_end|>"))
    spdlog::warn(
        "{}: the vocabulary has no <|im_start|>/<|im_end|> tokens; the ChatML markers will be plain text",
        tok.path());
}

ChatFormat ChatFormat::from_gguf(const GgufFile& f, const Tokenizer& tok) {
  ChatFormat c(tok);
  const GgufValue* t = f.find("tokenizer.chat_template");
  if (t && t->type == GgufType::STRING) {
    c.chatml_ = t->str.find("<|im_start|>") != std::string_view::npos;
    if (!c.chatml_)
      spdlog::warn("{}: tokenizer.chat_template is not a ChatML template (no <|im_start|>); using ChatML",
                   f.path());
  }
  return c;
}

bool ChatFormat::is_stop(int32_t id) const { return std::binary_search(stop_.begin(), stop_.end(), id); }

std::string ChatFormat::message(const ChatMessage& m) {
  return "<|im_start|>" + m.role + "\n" + m.content + std::string(kEndOfTurn);
}

std::string ChatFormat::think_prefix(bool thinking) {
  return thinking ? "<think>\n" : "<think>\n\n</think>\n\n";
}

std::string ChatFormat::generation_prompt(bool thinking) {
  return "<|im_start|>assistant\n" + think_prefix(thinking);
}

std::string ChatFormat::render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt,
                               bool thinking) {
  std::string s;
  for (const auto& m : msgs) s += message(m);
  if (add_generation_prompt) s += generation_prompt(thinking);
  return s;
}

std::string ChatHistory::add_user(std::string text, bool thinking) {
  std::string delta;
  if (assistant_open_) {
    delta += ChatFormat::kEndOfTurn;
    assistant_open_ = false;
  }
  if (msgs_.empty() && !system_.empty()) {
    msgs_.push_back({"system", system_});
    delta += ChatFormat::message(msgs_.back());
  }
  msgs_.push_back({"user", std::move(text)});
  delta += ChatFormat::message(msgs_.back());
  delta += ChatFormat::generation_prompt(thinking);
  msgs_.push_back({"assistant", ChatFormat::think_prefix(thinking)});
  open_prefix_ = msgs_.back().content;
  assistant_open_ = true;
  return delta;
}

void ChatHistory::add_assistant(std::string generated) {
  if (!assistant_open_) return;
  msgs_.back().content += generated;
}

bool ChatHistory::clear_last_answer() {
  if (!assistant_open_) return false;
  msgs_.back().content = open_prefix_;
  return true;
}

std::string ChatHistory::render() const {
  std::string s;
  for (size_t i = 0; i < msgs_.size(); ++i) {
    if (assistant_open_ && i + 1 == msgs_.size()) {
      s += "<|im_start|>assistant\n" + msgs_[i].content;
    } else {
      s += ChatFormat::message(msgs_[i]);
    }
  }
  return s;
}

void ChatHistory::clear() {
  msgs_.clear();
  assistant_open_ = false;
  open_prefix_.clear();
}

}  // namespace bonsai
