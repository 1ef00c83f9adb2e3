// Pre-tokenizers of byte-level BPE vocabularies: the regular expressions, named by GGUF's
// tokenizer.ggml.pre, that split text into words before BPE merges run inside each word.
//
// A pre-tokenizer is a sequence of patterns, each applied like Hugging Face's Split
// pre-tokenizer with behaviour "Isolated": every piece from the previous pattern is cut into
// its matches and the text between them, all kept, in order. The first pattern sees the whole
// text; a pattern never looks past the piece it runs on (so `$` and `(?!\S)` see a piece's
// end). Patterns are PCRE2 with UTF and UCP: \p{L}, \p{N}, \p{P}, \s come from the library's
// Unicode tables. Bytes that are not valid UTF-8 never match a pattern; they stay in the
// text between matches, so the pieces always concatenate back to the input.
//
// Immutable after construction and thread-safe (each split allocates its own match data).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvc::model {

class PreTokenizer {
 public:
  // The pre-tokenizer GGUF calls `name`. Throws Error naming it and listing the supported names
  // when it is not one of them. An empty name means "default" (llama.cpp's fallback for files
  // without tokenizer.ggml.pre).
  static PreTokenizer named(std::string_view name);

  // A pre-tokenizer from explicit patterns (tests, and vocabularies kvcache has no name for).
  // Throws Error with PCRE2's message and offset when a pattern does not compile.
  PreTokenizer(std::string name, std::span<const std::string_view> patterns,
               bool ignore_merges = false, bool add_bos = false);

  // Every name named() accepts, in a stable order.
  static std::vector<std::string_view> supported_names();

  // The words of text, as views into it; their concatenation is text.
  std::vector<std::string_view> split(std::string_view text) const;

  const std::string& name() const { return name_; }
  // Hugging Face's ignore_merges (Llama 3): a word that is itself a token is emitted whole.
  bool ignore_merges() const { return ignore_merges_; }
  // Whether models with this pre-tokenizer add BOS when the file does not say.
  bool add_bos_default() const { return add_bos_; }
  const std::vector<std::string>& patterns() const { return patterns_; }

 private:
  struct Pattern;
  std::string name_;
  std::vector<std::string> patterns_;
  std::vector<std::shared_ptr<const Pattern>> compiled_;
  bool ignore_merges_ = false;
  bool add_bos_ = false;
};

}  // namespace kvc::model
