#include "model/bpe_tokenizer.h"

#include <queue>

#include "base/error.h"
#include "base/utf8.h"
#include "model/byte_unicode.h"
#include "model/spm_tokenizer.h"
#include "model/symbol_merge.h"

namespace kvc::model {

namespace {

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;  // into the word
  uint32_t len;    // 0 once merged into its left neighbour
};

struct Pair {
  int rank;
  int32_t left;
  int32_t right;
  uint32_t len;  // left.len + right.len when pushed; lengths only grow, so a mismatch is stale
};

// Lowest rank first; on ties the leftmost pair.
struct PairOrder {
  bool operator()(const Pair& a, const Pair& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.left > b.left;
  }
};

std::string token_bytes(const Vocabulary& v, int32_t id) {
  const std::string& text = v.tokens[id];
  switch (v.types[id]) {
    case TokenType::kControl:
    case TokenType::kUnknown:
      return {};
    case TokenType::kUserDefined:
      return text;  // added tokens are stored as plain text
    case TokenType::kByte:
      if (const auto b = parse_byte_token(text)) return std::string(1, static_cast<char>(*b));
      return unicode_to_bytes(text);
    default:
      return unicode_to_bytes(text);
  }
}

}  // namespace

BpeTokenizer::BpeTokenizer(std::shared_ptr<const Vocabulary> vocab)
    : vocab_(std::move(vocab)), pre_(PreTokenizer::named(vocab_->pre)) {
  const Vocabulary& v = *vocab_;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const TokenType t = v.types[i];
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kByte) continue;
    token_ids_.emplace(v.tokens[i], static_cast<int32_t>(i));
  }
  ranks_.reserve(v.merges.size());
  for (size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    const size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 >= m.size()) {
      fail("tokenizer merge {} ('{}') is not two symbols separated by a space", i, m);
    }
    // The first rank of a duplicated merge wins.
    ranks_.emplace(m, static_cast<int>(i));
  }
}

int BpeTokenizer::rank(std::string_view left, std::string_view right, std::string& scratch) const {
  scratch.assign(left);
  scratch.push_back(' ');
  scratch.append(right);
  const auto it = ranks_.find(std::string_view(scratch));
  return it == ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::encode(std::string_view text, bool space_prefix,
                          std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string prefixed;
  if (space_prefix && text.front() != ' ') {
    prefixed = " ";
    prefixed.append(text);
    text = prefixed;
  }
  for (std::string_view word : pre_.split(text)) encode_word(bytes_to_unicode(word), out);
}

void BpeTokenizer::emit(std::string_view symbol, std::vector<int32_t>& out) const {
  if (const auto it = token_ids_.find(symbol); it != token_ids_.end()) {
    out.push_back(it->second);
    return;
  }
  for (size_t i = 0; i < symbol.size();) {
    const size_t n = utf8_sequence_length(symbol, i);
    if (const auto it = token_ids_.find(symbol.substr(i, n)); it != token_ids_.end()) {
      out.push_back(it->second);
    } else if (vocab_->unk_id >= 0) {
      out.push_back(vocab_->unk_id);
    }
    i += n;
  }
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (pre_.ignore_merges()) {
    if (const auto it = token_ids_.find(word); it != token_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size();) {
    const size_t n = utf8_sequence_length(word, i);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, index + 1, static_cast<uint32_t>(i), static_cast<uint32_t>(n)});
    i += n;
  }
  symbols.back().next = -1;

  std::string scratch;
  std::priority_queue<Pair, std::vector<Pair>, PairOrder> agenda;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const int k = rank(word.substr(l.start, l.len), word.substr(r.start, r.len), scratch);
    if (k >= 0) agenda.push({k, left, right, l.len + r.len});
  };
  merge_symbols(symbols, agenda, consider);
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    emit(word.substr(symbols[i].start, symbols[i].len), out);
  }
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) text += token_bytes(*vocab_, id);
  if (vocab_->add_space_prefix && text.starts_with(' ')) text.erase(0, 1);
  return text;
}

std::string BpeTokenizer::piece(int32_t id) const {
  return token_bytes(*vocab_, id);
}

}  // namespace kvc::model
