// A Jinja template: the subset of Jinja that models' chat templates use, with Hugging Face's
// environment (trim_blocks and lstrip_blocks on, raise_exception and strftime_now, tojson as
// json.dumps with ensure_ascii=False, lists and dicts immutable).
//
// Statements: for (else, if filter, loop.*, break/continue), if/elif/else, set (names,
// tuples, namespace attributes, blocks with filters), macro, call, filter, with, do, raw,
// generation/block/autoescape (their bodies render as is). Expressions: literals, lists,
// tuples, dicts, attributes, subscripts, slices, calls, filters, tests, arithmetic, ~,
// comparisons, in / not in, and/or/not, x if c else y. Undefined values behave as jinja2's
// default Undefined: they print as nothing, are false, iterate as empty, and raise on
// arithmetic, attribute access and calls.
//
// A Template is immutable after parse() and may be rendered from several threads at once.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/error.h"
#include "jinja/interpreter.h"
#include "jinja/lexer.h"
#include "jinja/value.h"

namespace kvc::jinja {

struct RenderOptions {
  Limits limits;
  std::function<std::time_t()> now;  // strftime_now's clock; empty: the system clock
};

class Template {
 public:
  // Throws SyntaxError naming the line and the problem.
  static Template parse(std::string_view source, const LexOptions& options = {});

  // Renders with the context's variables. Throws RenderError, RaisedError, UnsupportedError
  // or LimitError.
  std::string render(const std::vector<std::pair<std::string, Value>>& context,
                     const RenderOptions& options = {}) const;
  // The same with a JSON object as the context (its keys are the variable names).
  std::string render_json(const nlohmann::ordered_json& context,
                          const RenderOptions& options = {}) const;

 private:
  struct Program;
  explicit Template(std::shared_ptr<const Program> p) : program_(std::move(p)) {}
  std::shared_ptr<const Program> program_;
};

}  // namespace kvc::jinja
