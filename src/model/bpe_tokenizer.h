// Byte-level BPE ("gpt2") tokenization over a Vocabulary, as GPT-2, Llama 3, Qwen 2 and
// DeepSeek use it: the pre-tokenizer named by tokenizer.ggml.pre splits text into words; each
// word's bytes are mapped to the byte-level alphabet (byte_unicode.h); inside a word, the
// adjacent pair of symbols with the lowest merge rank (tokenizer.ggml.merges, "left right",
// rank = position) is merged, leftmost first on ties, until no ranked pair is left; each final
// symbol is a token. With ignore_merges (Llama 3) a word that is itself a token is emitted
// whole. Special and added tokens are matched before any of this, by Tokenizer.
//
// Decoding maps token text back through the alphabet, so decode(encode(s)) == s for every
// byte string s (all 256 byte characters are tokens in a byte-level vocabulary).
//
// Immutable after construction: thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/pretokenizer.h"
#include "model/vocabulary.h"

namespace kvc::model {

class BpeTokenizer {
 public:
  // Throws Error on a merge without a space, or a tokenizer.ggml.pre kvcache does not know.
  explicit BpeTokenizer(std::shared_ptr<const Vocabulary> vocab);

  // Appends the ids of text, which holds no special tokens. With space_prefix a space is put
  // before text unless it starts with one (ByteLevel's add_prefix_space).
  void encode(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;
  // Ids are in range (checked by the caller).
  std::string decode(std::span<const int32_t> ids) const;
  std::string piece(int32_t id) const;

  const PreTokenizer& pre_tokenizer() const { return pre_; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using IdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  // One pre-tokenized word, already in the byte-level alphabet.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  // The id for a final symbol; falls back to its characters, then to the unknown token.
  void emit(std::string_view symbol, std::vector<int32_t>& out) const;
  int rank(std::string_view left, std::string_view right, std::string& scratch) const;

  std::shared_ptr<const Vocabulary> vocab_;
  PreTokenizer pre_;
  IdMap token_ids_;  // text -> id of every token that text may produce
  IdMap ranks_;      // "left right" -> merge rank
};

}  // namespace kvc::model
