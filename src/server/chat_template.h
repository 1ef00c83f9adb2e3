// Chat templates: how a list of chat messages becomes one prompt for the model.
//
// A template is either one of four built-in formats (llama-2, chatml, llama-3, zephyr) or a
// Jinja program: the model's own tokenizer.chat_template, or a file given with
// --chat-template-file, executed by kvcache's Jinja interpreter (src/jinja) as Hugging Face
// renders it (messages, add_generation_prompt, bos_token, eos_token, tools and documents).
//
// Tokenizing a prompt: the special tokens of the vocabulary (control and user-defined ones)
// that appear in the rendered text become their ids, the text between them is encoded as
// text, and BOS is prepended when the tokenizer adds one, unless the text already begins
// with it. Built-in formats map their own markers the same way.
//
// Rendering errors become ApiError: a template that calls raise_exception answers 400 with
// the template's message; one that uses a Jinja feature kvcache lacks answers 500 naming it;
// any other failure of the template on the given messages (an undefined value, a type error,
// a resource limit) answers 400.
//
// A ChatTemplate is immutable after construction and safe to use from several threads.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/tokenizer.h"

namespace kvc::gguf {
class File;
}
namespace kvc::jinja {
class Template;
}

namespace kvc::server {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // The whole message as the client sent it, for Jinja templates that read more than role
  // and content (tool_calls, name, tool_call_id, ...); null when there is none. Templates see
  // this object with role and content taken from the two fields above (content stays null
  // when the client sent null).
  nlohmann::ordered_json json = nullptr;
};

enum class ChatFormat { kLlama2, kChatml, kLlama3, kZephyr, kJinja };

// Where the server's template comes from: the serve flags.
struct ChatTemplateFlags {
  std::string name;  // --chat-template: a built-in format
  std::string file;  // --chat-template-file: a Jinja template
};

class ChatTemplate {
 public:
  // A template of one of the built-in formats (not kJinja).
  explicit ChatTemplate(ChatFormat format);

  // The format named "llama-2", "chatml", "llama-3" or "zephyr"; throws Error listing them.
  static ChatTemplate named(const std::string& name);
  // A Jinja template; bos_token and eos_token are the texts the template sees, origin says
  // where it came from (for logs). Throws jinja::SyntaxError (an Error) naming the line.
  static ChatTemplate jinja(const std::string& source, std::string bos_token, std::string eos_token,
                            std::string origin);
  // Which built-in format a Jinja chat template is, by its markers; nullopt when none fits.
  static std::optional<ChatTemplate> recognise(const std::string& jinja);

  // The template to serve a model with, in this order:
  //   --chat-template-file FILE: that Jinja template (an error if it cannot be read or parsed);
  //   --chat-template NAME: that built-in format;
  //   the GGUF's tokenizer.chat_template, executed as Jinja; if it does not parse, a warning
  //   and the built-in format its markers show, else chatml (llama-server also falls back to
  //   chatml rather than refusing to start: the server stays usable and the log says why);
  //   no template in the model: chatml, as llama.cpp does.
  // note receives the log line saying where the choice came from; warning is set when it
  // is a fallback the operator should know about.
  static ChatTemplate for_model(const gguf::File& file, const ChatTemplateFlags& flags,
                                std::string& note, bool& warning);
  // The same with only --chat-template.
  static ChatTemplate for_model(const gguf::File& file, const std::string& override_name,
                                std::string& note);

  ChatFormat format() const { return format_; }
  // "llama-2", "chatml", "llama-3", "zephyr", or for Jinja where it came from.
  std::string name() const;

  // Token ids of messages followed, with add_generation_prompt, by the opening of the
  // assistant's turn (see the top).
  std::vector<int32_t> apply(const std::vector<ChatMessage>& messages,
                             const model::Tokenizer& tokenizer,
                             bool add_generation_prompt = true) const;
  // The prompt as text (special markers spelled out), with the assistant's opening when
  // add_generation_prompt; extra adds variables (tools, documents, ...) for Jinja templates.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true,
                     const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;

  // What ends the assistant's turn: token ids for markers the vocabulary has, and stop strings
  // for those it lacks.
  void end_of_turn(const model::Tokenizer& tokenizer, std::vector<int32_t>& stop_tokens,
                   std::vector<std::string>& stop_strings) const;

  // Ids of text in which the vocabulary's special tokens are parsed as such, with BOS first
  // when the tokenizer adds one and text does not already begin with it.
  static std::vector<int32_t> tokenize(const std::string& text, const model::Tokenizer& tokenizer);

 private:
  struct Part {
    std::string text;
    bool special = false;  // a marker that maps to one token id when the vocabulary has it
  };
  std::vector<Part> parts(const std::vector<ChatMessage>& messages,
                          bool add_generation_prompt) const;

  ChatFormat format_;
  std::shared_ptr<const jinja::Template> jinja_;
  std::string source_, bos_token_, eos_token_, origin_;
};

// Every built-in format's name, comma-separated, for messages.
std::string chat_template_names();

}  // namespace kvc::server
