// SentencePiece-style ("llama"/spm) tokenization over a Vocabulary: score-driven BPE over
// UTF-8 characters with byte fallback, as SentencePiece's BPE model and llama.cpp's spm
// tokenizer do.
//
// Text maps to ids like this: spaces become U+2581 "▁", a dummy "▁" is prepended when
// add_space_prefix is set, the text is split into UTF-8 characters (user-defined tokens are
// matched first and never split or merged; a byte that is not part of a valid UTF-8 sequence is
// a symbol of its own), and the adjacent pair whose concatenation is the highest-scoring token
// is merged (ties: leftmost) until no pair merges. Symbols that are not tokens become byte
// tokens <0xXX>, or the unknown token when the vocabulary has none.
//
// decode(encode(s)) == s for every byte string s that does not contain U+2581 itself (that
// character is how spaces are stored, so it decodes to a space, as in SentencePiece).
//
// Immutable after construction: thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/vocabulary.h"

namespace kvc::model {

class SpmTokenizer {
 public:
  // vocab has been validated by Tokenizer (sizes, ids, types). Throws Error on what only
  // SentencePiece needs: malformed or duplicate byte tokens, an incomplete set (all 256 or
  // none), or neither byte tokens nor an unknown token.
  explicit SpmTokenizer(std::shared_ptr<const Vocabulary> vocab);

  // Appends the ids of text (no BOS); the dummy prefix is added when space_prefix is set.
  void encode(std::string_view text, bool space_prefix, std::vector<int32_t>& out) const;
  // Ids are in range (checked by the caller).
  std::string decode(std::span<const int32_t> ids) const;
  std::string piece(int32_t id) const;
  bool has_byte_tokens() const { return byte_ids_[0] >= 0; }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using IdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

  std::shared_ptr<const Vocabulary> vocab_;
  IdMap merge_ids_;  // tokens that text may merge into: normal, undefined, user-defined, unused
  std::array<int32_t, 256> byte_ids_{};  // -1 when the vocabulary has no byte tokens
  size_t max_merge_bytes_ = 0;           // longest token in merge_ids_: longer pairs cannot merge
  // Byte trie of the user-defined tokens (node 0 is the root); empty when there are none.
  std::unordered_map<uint64_t, int32_t> user_edges_;  // (node << 8 | byte) -> child node
  std::vector<bool> user_terminal_;                   // node ends a user-defined token
};

// "<0xXX>" -> XX.
std::optional<uint8_t> parse_byte_token(std::string_view t);

}  // namespace kvc::model
