#include "jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "jinja/error.h"

namespace kvc::jinja {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's unicode-escape decoding of a string literal's body, as jinja2 does it.
std::string decode_string(std::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c != '\\' || i + 1 == body.size()) {
      out += c;
      continue;
    }
    const char e = body[++i];
    switch (e) {
      case '\n':
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'n':
        out += '\n';
        break;
      case 'r':
        out += '\r';
        break;
      case 't':
        out += '\t';
        break;
      case 'v':
        out += '\v';
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t cp = 0;
        bool ok = i + n < body.size();
        for (size_t k = 1; ok && k <= n; ++k) {
          const int h = hex_value(body[i + k]);
          if (h < 0) ok = false;
          cp = cp * 16 + static_cast<uint32_t>(h);
        }
        if (!ok || cp > 0x10FFFF) throw SyntaxError("malformed \\" + std::string(1, e) + " escape");
        append_utf8(out, cp);
        i += n;
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + static_cast<uint32_t>(body[++i] - '0');
          }
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view input, const LexOptions& o) : o_(o) {
    src_.reserve(input.size());
    for (size_t i = 0; i < input.size(); ++i) {
      if (input[i] == '\r') {
        src_ += '\n';
        if (i + 1 < input.size() && input[i + 1] == '\n') ++i;
      } else {
        src_ += input[i];
      }
    }
    if (!o_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit_text(pos, src_.substr(pos));
        break;
      }
      const char kind = src_[tag + 1];
      const char mod = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      emit_text(pos, control_text(pos, tag, kind, mod));
      if (kind == '#') {
        const size_t end = src_.find("#}", tag + 2);
        if (end == std::string::npos) fail_at(tag, "unterminated comment");
        const char before = end > tag + 2 ? src_[end - 1] : '\0';
        pos = after_end(end + 2, before, true);
        continue;
      }
      pos = lex_tag(tag, kind, mod);
    }
    out_.push_back(Token{TokenType::kEof, "", 0, 0, line_of(src_.size())});
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail_at(size_t pos, const std::string& what) const {
    throw SyntaxError(fmt::format("template syntax error at line {}: {}", line_of(pos), what));
  }

  int line_of(size_t pos) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), pos) -
                                newlines_.begin());
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  // The text [pos, tag) after the whitespace control of the tag at tag.
  std::string_view control_text(size_t pos, size_t tag, char kind, char mod) const {
    std::string_view text(src_.data() + pos, tag - pos);
    if (mod == '-') {
      while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
    } else if (mod != '+' && o_.lstrip_blocks && kind != '{') {
      const size_t nl = text.rfind('\n');
      const size_t l = nl == std::string_view::npos ? 0 : nl + 1;
      const bool line_start = l > 0 || pos == 0 || src_[pos - 1] == '\n';
      if (line_start && l < text.size() &&
          std::all_of(text.begin() + static_cast<ptrdiff_t>(l), text.end(),
                      [](char c) { return is_space(c) && c != '\n'; })) {
        text = text.substr(0, l);
      }
    }
    return text;
  }

  // Position after a tag's end marker at end, given the character before the marker.
  size_t after_end(size_t end, char before, bool block) const {
    if (before == '-') {
      while (end < src_.size() && is_space(src_[end])) ++end;
    } else if (before != '+' && block && o_.trim_blocks && end < src_.size() && src_[end] == '\n') {
      ++end;
    }
    return end;
  }

  void emit_text(size_t pos, std::string_view text) {
    if (!text.empty())
      out_.push_back(Token{TokenType::kText, std::string(text), 0, 0, line_of(pos)});
  }

  void push(TokenType t, std::string text, size_t pos) {
    out_.push_back(Token{t, std::move(text), 0, 0, line_of(pos)});
  }

  size_t lex_tag(size_t tag, char kind, char mod) {
    const bool block = kind == '%';
    const size_t first = out_.size();
    push(block ? TokenType::kBlockBegin : TokenType::kVarBegin, block ? "{%" : "{{", tag);
    size_t p = tag + 2;
    if (mod == '-' || mod == '+') ++p;
    int balance = 0;
    const char close = block ? '%' : '}';
    for (;;) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size()) fail_at(tag, block ? "unterminated {% tag" : "unterminated {{ tag");
      if (balance == 0) {
        const bool signed_end = (src_[p] == '-' || src_[p] == '+') && p + 2 < src_.size() &&
                                src_[p + 1] == close && src_[p + 2] == '}';
        if (signed_end || (src_[p] == close && p + 1 < src_.size() && src_[p + 1] == '}')) {
          const char before = signed_end ? src_[p] : '\0';
          const size_t end = p + (signed_end ? 3 : 2);
          push(block ? TokenType::kBlockEnd : TokenType::kVarEnd, block ? "%}" : "}}", p);
          size_t next = after_end(end, before, block);
          if (block && out_.size() == first + 3 && out_[first + 1].type == TokenType::kName &&
              out_[first + 1].text == "raw") {
            out_.resize(first);
            next = lex_raw(tag, next);
          }
          return next;
        }
      }
      p = lex_token(p, balance);
    }
  }

  // The body of {% raw %} starting at pos, up to its {% endraw %}; returns the position after.
  size_t lex_raw(size_t tag, size_t pos) {
    for (size_t c = src_.find("{%", pos); c != std::string::npos; c = src_.find("{%", c + 1)) {
      size_t q = c + 2;
      const char mod = q < src_.size() ? src_[q] : '\0';
      if (mod == '-' || mod == '+') ++q;
      while (q < src_.size() && is_space(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && is_space(src_[q])) ++q;
      char before = '\0';
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) before = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      emit_text(pos, control_text(pos, c, '%', mod));
      return after_end(q + 2, before, true);
    }
    fail_at(tag, "{% raw %} without {% endraw %}");
  }

  size_t lex_token(size_t p, int& balance) {
    const char c = src_[p];
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      push(TokenType::kName, src_.substr(p, e - p), p);
      return e;
    }
    if (is_digit(c)) return lex_number(p);
    if (c == '\'' || c == '"') {
      size_t e = p + 1;
      while (e < src_.size() && src_[e] != c) e += src_[e] == '\\' ? 2 : 1;
      if (e >= src_.size()) fail_at(p, "unterminated string literal");
      Token t{TokenType::kString, "", 0, 0, line_of(p)};
      try {
        t.text = decode_string(std::string_view(src_).substr(p + 1, e - p - 1));
      } catch (const SyntaxError& err) {
        fail_at(p, err.what());
      }
      out_.push_back(std::move(t));
      return e + 1;
    }
    static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const char* op : kTwo) {
      if (src_.compare(p, 2, op) == 0) {
        push(TokenType::kOp, op, p);
        return p + 2;
      }
    }
    if (std::strchr("+-*/%~<>=()[]{},.:|", c) != nullptr) {
      if (c == '(' || c == '[' || c == '{') ++balance;
      if ((c == ')' || c == ']' || c == '}') && balance > 0) --balance;
      push(TokenType::kOp, std::string(1, c), p);
      return p + 1;
    }
    fail_at(p, fmt::format("unexpected character '{}'", c));
  }

  size_t lex_number(size_t p) {
    const auto digits = [&](size_t i) {
      while (i < src_.size() && (is_digit(src_[i]) ||
                                 (src_[i] == '_' && i + 1 < src_.size() && is_digit(src_[i + 1]))))
        ++i;
      return i;
    };
    size_t e = digits(p);
    bool is_float = false;
    const bool after_dot =
        !out_.empty() && out_.back().type == TokenType::kOp && out_.back().text == ".";
    if (!after_dot) {
      if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
        e = digits(e + 1);
        is_float = true;
      }
      if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
        size_t x = e + 1;
        if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < src_.size() && is_digit(src_[x])) {
          e = digits(x);
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = p; i < e; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t{is_float ? TokenType::kFloat : TokenType::kInt, text, 0, 0, line_of(p)};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      char* end = nullptr;
      const long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno == ERANGE) fail_at(p, "integer literal " + text + " is too large");
      t.int_value = v;
    }
    out_.push_back(std::move(t));
    return e;
  }

  LexOptions o_;
  std::string src_;
  std::vector<size_t> newlines_;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace kvc::jinja
