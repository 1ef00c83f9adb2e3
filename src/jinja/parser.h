// The Jinja parser: tokens -> syntax tree. Stateless function; thread-safe.
#pragma once

#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace kvc::jinja {

// Nesting of expressions and blocks beyond this is a syntax error (parsing and evaluation
// recurse over the tree).
inline constexpr int kMaxParseDepth = 128;

// Throws SyntaxError naming the line and what was expected.
Body parse(const std::vector<Token>& tokens);

}  // namespace kvc::jinja
