// Qwen3.5 chat format (ChatML with a thinking block):
//
//   <|im_start|>system\n{system}<|im_end|>\n
//   <|im_start|>user\n{text}<|im_end|>\n
//   <|im_start|>assistant\n<think>\n                       <- generation prompt, thinking on
//   <|im_start|>assistant\n<think>\n\n</think>\n\n         <- generation prompt, thinking off
//   {generated text}<|im_end|>\n
//
// The file's tokenizer.chat_template (Jinja) is not executed: a template of
// the ChatML family (it mentions <|im_start|>) is rendered by this fixed code;
// any other template is reported once and ChatML is used anyway.
//
// ChatHistory keeps a conversation as the exact text the model has been fed,
// so a chat session can append each new turn to the existing KV cache: the
// concatenation of every delta it returns equals render() of the history.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bonsai {

class GgufFile;
class Tokenizer;

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;  // for the assistant: everything after "<|im_start|>assistant\n"
};

class ChatFormat {
 public:
  // Plain ChatML with the stop tokens found in `tok`.
  explicit ChatFormat(const Tokenizer& tok);
  // Reads tokenizer.chat_template from `f` (absent: ChatML); a template
  // without <|im_start|> is reported once with spdlog::warn.
  static ChatFormat from_gguf(const GgufFile& f, const Tokenizer& tok);

  // "<|im_start|>{role}\n{content}<|im_end|>\n"
  static std::string message(const ChatMessage& m);
  // "<|im_start|>assistant\n" + think_prefix(thinking)
  static std::string generation_prompt(bool thinking);
  // What the generation prompt puts after "assistant\n": "<think>\n" (on) or
  // "<think>\n\n</think>\n\n" (off).
  static std::string think_prefix(bool thinking);
  static constexpr std::string_view kEndOfTurn = "<|im_end|>\n";

  // All messages, then the generation prompt when asked.
  static std::string render(const std::vector<ChatMessage>& msgs, bool add_generation_prompt, bool thinking);

  // Token ids that end an answer: <|im_end|>, <|endoftext|> and the file's
  // EOS, those that exist (deduplicated, ascending).
  const std::vector<int32_t>& stop_tokens() const { return stop_; }
  bool is_stop(int32_t id) const;
  // True when the file's template was recognised as ChatML (or absent).
  bool template_is_chatml() const { return chatml_; }
  // The ids of "<think>" / "</think>" when they are single tokens, else -1.
  int32_t think_open() const { return think_open_; }
  int32_t think_close() const { return think_close_; }

 private:
  std::vector<int32_t> stop_;
  bool chatml_ = true;
  int32_t think_open_ = -1, think_close_ = -1;
};

// A conversation as fed to one session. Usage per turn:
//   feed(add_user(text, thinking)); generate; add_assistant(generated text);
class ChatHistory {
 public:
  explicit ChatHistory(std::string system_prompt = {}) : system_(std::move(system_prompt)) {}

  // The text to feed for a new user message: the end of the previous
  // assistant turn (its <|im_end|>\n was never fed: generation stopped on it,
  // or was cut short), the system prompt on the first turn, the user turn and
  // the generation prompt.
  std::string add_user(std::string text, bool thinking);
  // Records what the model generated for the open assistant turn (the text
  // after the generation prompt, without the stop token).
  void add_assistant(std::string generated);
  // Drops the open assistant turn's generated text (for /regen); the
  // generation prompt stays. Returns false when no assistant turn is open.
  bool clear_last_answer();

  // Everything fed so far, including the open assistant turn (without its
  // <|im_end|>): equals the concatenation of the add_user() deltas and the
  // generated texts.
  std::string render() const;
  const std::vector<ChatMessage>& messages() const { return msgs_; }
  const std::string& system_prompt() const { return system_; }
  // Forgets the conversation; the system prompt is replaced when `system` is given.
  void clear();
  void set_system(std::string system) { system_ = std::move(system); }
  bool empty() const { return msgs_.empty(); }

 private:
  std::string system_;
  std::vector<ChatMessage> msgs_;
  bool assistant_open_ = false;  // last message is an assistant turn without its <|im_end|>
  std::string open_prefix_;      // think prefix of the open assistant turn
};

}  // namespace bonsai
