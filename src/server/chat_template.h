// Chat templates: how a list of chat messages becomes one prompt for the model.
//
// Four formats are built in: llama-2, chatml, llama-3 and zephyr. A GGUF's
// tokenizer.chat_template (a Jinja program) is recognised as one of them by its distinctive
// markers rather than executed. Special markers (<|im_start|>, <|eot_id|>, </s>, ...) become
// their token ids when the vocabulary has them, and plain text otherwise.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kvc::gguf {
class File;
}

namespace kvc::server {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatFormat { kLlama2, kChatml, kLlama3, kZephyr };

class ChatTemplate {
 public:
  // A template of one of the built-in formats.
  explicit ChatTemplate(ChatFormat format) : format_(format) {}

  // The format named "llama-2", "chatml", "llama-3" or "zephyr"; throws Error listing them.
  static ChatTemplate named(const std::string& name);
  // Which built-in format a Jinja chat template is, by its markers; nullopt when none fits.
  static std::optional<ChatTemplate> recognise(const std::string& jinja);
  // The template to serve a model with: --chat-template when given (override), else the
  // GGUF's tokenizer.chat_template when it is recognised, else chatml when the model has no
  // template (what llama.cpp falls back to). Throws Error for an unrecognised template
  // without an override, saying to pass --chat-template. note receives a log line saying
  // where the choice came from.
  static ChatTemplate for_model(const gguf::File& file, const std::string& override_name,
                                std::string& note);

  ChatFormat format() const { return format_; }
  // "llama-2", "chatml", "llama-3" or "zephyr".
  std::string name() const;

  // Token ids of messages followed by the opening of the assistant's turn, with BOS first
  // when the tokenizer adds one.
  std::vector<int32_t> apply(const std::vector<ChatMessage>& messages,
                             const model::Tokenizer& tokenizer) const;
  // The prompt as text (special markers spelled out), for logs and tests.
  std::string render(const std::vector<ChatMessage>& messages) const;

  // What ends the assistant's turn: token ids for markers the vocabulary has, and stop strings
  // for those it lacks.
  void end_of_turn(const model::Tokenizer& tokenizer, std::vector<int32_t>& stop_tokens,
                   std::vector<std::string>& stop_strings) const;

 private:
  struct Part {
    std::string text;
    bool special = false;  // a marker that maps to one token id when the vocabulary has it
  };
  std::vector<Part> parts(const std::vector<ChatMessage>& messages) const;

  ChatFormat format_;
};

// Every built-in format's name, comma-separated, for messages.
std::string chat_template_names();

}  // namespace kvc::server
