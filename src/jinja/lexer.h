// The Jinja lexer: template source -> tokens, with Jinja's whitespace control applied to the
// text between tags ({%- -%} {{- -}} {#- -#}, {%+ +%}, trim_blocks, lstrip_blocks, and the
// one trailing newline jinja2 drops). Comments are dropped; {% raw %} bodies become text.
// Stateless functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvc::jinja {

struct LexOptions {
  bool trim_blocks = true;  // Hugging Face renders with both on
  bool lstrip_blocks = true;
  bool keep_trailing_newline = false;
};

enum class TokenType {
  kText,        // template data
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOp,  // operators and punctuation: + - * / // % ** ~ == != < <= > >= = ( ) [ ] { } , . : |
  kEof,
};

struct Token {
  TokenType type;
  std::string text;  // text, name, operator, or the decoded string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Throws SyntaxError naming the line of an unterminated tag, comment or string, or of a
// character that starts no token.
std::vector<Token> lex(std::string_view source, const LexOptions& options = {});

}  // namespace kvc::jinja
