#include "model/spm_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>
#include <queue>
#include <utility>

#include "base/error.h"
#include "base/utf8.h"
#include "model/symbol_merge.h"

namespace kvc::model {

std::optional<uint8_t> parse_byte_token(std::string_view t) {
  if (t.size() != 6 || t.substr(0, 3) != "<0x" || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  const int hi = hex(t[3]);
  const int lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return static_cast<uint8_t>(hi * 16 + lo);
}

namespace {

constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";       // U+2581, SentencePiece's space
constexpr std::string_view kUnknownSurface = " \xE2\x81\x87 ";  // " ⁇ ", SentencePiece's default
// Symbol indices are int32_t; the escaped text can be up to 3x the input.
constexpr size_t kMaxTextBytes = size_t{1} << 28;

bool mergeable(TokenType t) {
  return t == TokenType::kNormal || t == TokenType::kUndefined || t == TokenType::kUserDefined ||
         t == TokenType::kUnused;
}

// Bytes in the UTF-8 character at s[i]; 1 for a byte that does not start a complete sequence,
// so that invalid input still splits into symbols that byte fallback can carry.
size_t utf8_char_len(std::string_view s, size_t i) {
  const size_t n = utf8_sequence_length(s, i);
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

// Replaces every U+2581 with ' '.
void append_unescaped(std::string& out, std::string_view s) {
  size_t at = 0;
  for (size_t hit = s.find(kSpaceSymbol); hit != std::string_view::npos;
       hit = s.find(kSpaceSymbol, at)) {
    out.append(s.substr(at, hit - at));
    out.push_back(' ');
    at = hit + kSpaceSymbol.size();
  }
  out.append(s.substr(at));
}

struct Symbol {
  int32_t prev;
  int32_t next;
  uint32_t start;  // into the escaped text
  uint32_t len;    // 0 once merged into its left neighbour
  bool frozen;     // a user-defined token: never merged
};

struct Pair {
  float score;
  int32_t left;
  int32_t right;
  uint32_t len;  // left.len + right.len when pushed; a mismatch later means the pair is stale
};

// Highest score first; on ties the leftmost pair, as SentencePiece does.
struct PairOrder {
  bool operator()(const Pair& a, const Pair& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

SpmTokenizer::SpmTokenizer(std::shared_ptr<const Vocabulary> vocab) : vocab_(std::move(vocab)) {
  const Vocabulary& v = *vocab_;
  const size_t n = v.tokens.size();
  byte_ids_.fill(-1);
  size_t n_bytes = 0;
  std::vector<std::string_view> user_defined;
  for (size_t i = 0; i < n; ++i) {
    const std::string& tok = v.tokens[i];
    const TokenType type = v.types[i];
    const auto id = static_cast<int32_t>(i);
    if (type == TokenType::kByte) {
      const auto byte = parse_byte_token(tok);
      if (!byte) fail("tokenizer token {} has type byte but text '{}', not <0xXX>", i, tok);
      if (byte_ids_[*byte] >= 0) {
        fail("tokenizer byte token {} ('{}') duplicates token {}", i, tok, byte_ids_[*byte]);
      }
      byte_ids_[*byte] = id;
      ++n_bytes;
    } else if (mergeable(type) && !tok.empty()) {
      if (merge_ids_.emplace(tok, id).second)
        max_merge_bytes_ = std::max(max_merge_bytes_, tok.size());
      if (type == TokenType::kUserDefined) user_defined.push_back(tok);
    }
  }
  if (n_bytes != 0 && n_bytes != 256) {
    size_t missing = 0;
    while (byte_ids_[missing] >= 0) ++missing;
    fail("tokenizer vocabulary has {} byte tokens, not all 256: <0x{:02X}> is missing", n_bytes,
         missing);
  }
  if (n_bytes == 0 && v.unk_id < 0) {
    fail(
        "tokenizer vocabulary has neither byte tokens nor an unknown token: "
        "text outside the vocabulary could not be encoded");
  }

  if (!user_defined.empty()) {
    user_terminal_.push_back(false);
    for (std::string_view tok : user_defined) {
      uint64_t node = 0;
      for (char c : tok) {
        const uint64_t key = node << 8 | static_cast<uint8_t>(c);
        auto [it, inserted] = user_edges_.emplace(key, static_cast<int32_t>(user_terminal_.size()));
        if (inserted) user_terminal_.push_back(false);
        node = static_cast<uint64_t>(it->second);
      }
      user_terminal_[node] = true;
    }
  }
}

void SpmTokenizer::encode(std::string_view text, bool space_prefix,
                          std::vector<int32_t>& out) const {
  // SentencePiece adds no dummy prefix to empty text.
  if (text.empty()) return;
  if (text.size() > kMaxTextBytes) {
    fail("text of {} bytes is too long to tokenize (limit {})", text.size(), kMaxTextBytes);
  }

  std::string s;
  s.reserve(text.size() + text.size() / 4 + kSpaceSymbol.size());
  if (space_prefix) s.append(kSpaceSymbol);
  for (char c : text) {
    if (c == ' ') {
      s.append(kSpaceSymbol);
    } else {
      s.push_back(c);
    }
  }

  // Longest user-defined token at s[i], 0 when none.
  auto user_match = [&](size_t i) -> size_t {
    if (user_terminal_.empty()) return 0;
    size_t best = 0;
    uint64_t node = 0;
    for (size_t j = i; j < s.size(); ++j) {
      const auto it = user_edges_.find(node << 8 | static_cast<uint8_t>(s[j]));
      if (it == user_edges_.end()) break;
      node = static_cast<uint64_t>(it->second);
      if (user_terminal_[node]) best = j - i + 1;
    }
    return best;
  };

  std::vector<Symbol> symbols;
  symbols.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t len = user_match(i);
    const bool frozen = len > 0;
    if (!frozen) len = utf8_char_len(s, i);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back(
        {index - 1, index + 1, static_cast<uint32_t>(i), static_cast<uint32_t>(len), frozen});
    i += len;
  }
  symbols.back().next = -1;

  std::priority_queue<Pair, std::vector<Pair>, PairOrder> agenda;
  // How an unused token that was merged through splits back into the two pieces it came from.
  std::unordered_map<std::string_view, uint32_t> unused_splits;
  auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    if (l.frozen || r.frozen) return;
    const uint32_t len = l.len + r.len;
    if (len > max_merge_bytes_) return;
    const std::string_view merged(s.data() + l.start, len);
    const auto it = merge_ids_.find(merged);
    if (it == merge_ids_.end()) return;
    agenda.push({vocab_->scores[it->second], left, right, len});
    if (vocab_->types[it->second] == TokenType::kUnused) unused_splits[merged] = l.len;
  };
  merge_symbols(symbols, agenda, consider);

  // Emits one final symbol; an unused token is split back into the pieces it was merged from.
  std::vector<std::string_view> pending;
  auto emit = [&](std::string_view symbol) {
    pending.push_back(symbol);
    while (!pending.empty()) {
      const std::string_view piece = pending.back();
      pending.pop_back();
      if (const auto it = merge_ids_.find(piece); it != merge_ids_.end()) {
        if (vocab_->types[it->second] != TokenType::kUnused) {
          out.push_back(it->second);
          continue;
        }
        if (const auto split = unused_splits.find(piece); split != unused_splits.end()) {
          pending.push_back(piece.substr(split->second));
          pending.push_back(piece.substr(0, split->second));
          continue;
        }
      }
      if (has_byte_tokens()) {
        for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      } else {
        out.push_back(vocab_->unk_id);
      }
    }
  };
  for (int32_t i = 0; i >= 0; i = symbols[i].next) {
    emit(std::string_view(s.data() + symbols[i].start, symbols[i].len));
  }
}

std::string SpmTokenizer::decode(std::span<const int32_t> ids) const {
  // Pieces are joined with spaces still escaped, so that byte tokens spelling U+2581 (a
  // vocabulary without "▁") also decode to spaces, as SentencePiece does.
  std::string raw;
  for (int32_t id : ids) {
    switch (vocab_->types[id]) {
      case TokenType::kControl:
        break;
      case TokenType::kByte:
        raw.push_back(static_cast<char>(*parse_byte_token(vocab_->tokens[id])));
        break;
      case TokenType::kUnknown:
        raw.append(kUnknownSurface);
        break;
      default:
        raw.append(vocab_->tokens[id]);
        break;
    }
  }
  std::string_view body = raw;
  if (vocab_->add_space_prefix && body.starts_with(kSpaceSymbol)) {
    body.remove_prefix(kSpaceSymbol.size());
  }
  std::string text;
  text.reserve(body.size());
  append_unescaped(text, body);
  return text;
}

std::string SpmTokenizer::piece(int32_t id) const {
  switch (vocab_->types[id]) {
    case TokenType::kControl:
      return {};
    case TokenType::kByte:
      return std::string(1, static_cast<char>(*parse_byte_token(vocab_->tokens[id])));
    case TokenType::kUnknown:
      return std::string(kUnknownSurface);
    default: {
      std::string text;
      append_unescaped(text, vocab_->tokens[id]);
      return text;
    }
  }
}

}  // namespace kvc::model
